"""`lab up` (foreground, detached), `lab ps`, `lab fault`, `lab down`, `lab clean` as real
processes, launching the stand-ins of fake_proc.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launch.events import read_events
from tests.launch.helpers import alive

LAB = str(Path(sys.executable).with_name("lab"))


def lab(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([LAB, *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def wait_state(run_dir: Path, wanted: str, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = json.loads((run_dir / "state.json").read_text())
            if state["state"] == wanted:
                return state
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"{run_dir} never reached state {wanted}")


def recorded(state: dict) -> list[tuple[int, float]]:
    return [(p["pid"], p["create_time"]) for p in state["processes"]]


def wait_gone(pids: list[tuple[int, float]], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(*p) for p in pids):
        time.sleep(0.1)
    assert not [p for p in pids if alive(*p)], "processes survived"


def start_up(run_dir: Path, env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen([LAB, "up", "--out", str(run_dir), "--grace", "3", *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def test_foreground_up_prints_url_and_stops_on_sigint(tmp_path: Path, fake_env: dict) -> None:
    run_dir = tmp_path / "run"
    proc = start_up(run_dir, fake_env, "--disagg")
    try:
        state = wait_state(run_dir, "ready")
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert f"frontend: {state['frontend_url']}" in out
    for name in ("engine-prefill-0", "sidecar-decode-0", "frontend"):
        assert name in out
    assert "stopped" in err
    wait_gone(recorded(state), timeout=2)
    assert wait_state(run_dir, "stopped", timeout=1)


def test_sigkilled_launcher_takes_its_children(tmp_path: Path, fake_env: dict) -> None:
    run_dir = tmp_path / "run"
    proc = start_up(run_dir, fake_env, "--engines", "2")
    try:
        state = wait_state(run_dir, "ready")
        pids = recorded(state)
        assert len(pids) == 5 and all(alive(*p) for p in pids)
        proc.kill()  # SIGKILL: no teardown code runs
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    wait_gone(pids, timeout=10)


def test_detach_ps_fault_down(tmp_path: Path, fake_env: dict) -> None:
    run_dir = tmp_path / "run"
    result = lab("up", "--detach", "--out", str(run_dir), "--grace", "3", env=fake_env)
    try:
        assert result.returncode == 0, result.stderr
        state = json.loads((run_dir / "state.json").read_text())
        assert f"frontend: {state['frontend_url']}" in result.stdout
        assert alive(state["supervisor_pid"], state["supervisor_create_time"])

        ps = lab("ps", str(run_dir), env=fake_env)
        assert ps.returncode == 0, ps.stderr
        assert "sidecar-0" in ps.stdout and "ready" in ps.stdout

        fault = lab("fault", str(run_dir), "--process", "sidecar-0", "--kind", "kill",
                    env=fake_env)
        assert fault.returncode == 0, fault.stderr
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            info = json.loads(lab("ps", str(run_dir), "--json", env=fake_env).stdout)
            sidecar = next(p for p in info["processes"] if p["name"] == "sidecar-0")
            if sidecar["restarts"] == 1 and sidecar["state"] == "ready" and sidecar["alive"]:
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"sidecar-0 not restarted: {sidecar}")

        bad = lab("fault", str(run_dir), "--process", "engine-7", "--kind", "kill", env=fake_env)
        assert bad.returncode == 2 and "engine-7" in bad.stderr
        notengine = lab("fault", str(run_dir), "--process", "frontend", "--kind", "freeze",
                        env=fake_env)
        assert notengine.returncode == 1 and "engines" in notengine.stderr

        state = json.loads((run_dir / "state.json").read_text())
        down = lab("down", str(run_dir), env=fake_env)
        assert down.returncode == 0, down.stderr
        assert "stopped" in down.stdout
        wait_gone([*recorded(state), (state["supervisor_pid"], state["supervisor_create_time"])],
                  timeout=5)
        assert json.loads((run_dir / "state.json").read_text())["state"] == "stopped"
    finally:
        lab("down", str(run_dir), env=fake_env)
    events = read_events(run_dir / "events.jsonl")
    assert ("fault", "sidecar-0") in {(e["event"], e["name"]) for e in events}
    assert any(e["event"] == "exit" and e["name"] == "sidecar-0" and e["code"] == -9
               for e in events)


def test_up_failure_names_process_and_exits_1(tmp_path: Path, fake_env: dict) -> None:
    env = {**fake_env, "FAKE_FAIL_START": "sidecar-0"}
    result = lab("up", "--out", str(tmp_path / "run"), "--grace", "2", env=env)
    assert result.returncode == 1
    assert "sidecar-0 did not become ready: exited with code 3" in result.stderr
    assert "failing on purpose" in result.stderr
    assert "Traceback" not in result.stderr
    detached = lab("up", "--detach", "--out", str(tmp_path / "run2"), "--grace", "2", env=env)
    assert detached.returncode == 1 and "sidecar-0" in detached.stderr


def test_clean_kills_orphans_of_a_dead_supervisor(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    import psutil

    env = {**os.environ, "LAB_SUPERVISOR_PID": str(dead.pid),
           "LAB_SUPERVISOR_START": "1.0", "LAB_PROCESS_NAME": "engine-9",
           "LAB_RUN_DIR": str(tmp_path)}
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env,
                              start_new_session=True)
    try:
        time.sleep(0.3)
        ct = psutil.Process(orphan.pid).create_time()
        dry = lab("clean", "--results", str(tmp_path), "--dry-run", env=dict(os.environ))
        assert f"would kill engine-9 (pid {orphan.pid})" in dry.stdout
        assert alive(orphan.pid, ct)
        result = lab("clean", "--results", str(tmp_path), env=dict(os.environ))
        assert result.returncode == 0
        assert f"killed engine-9 (pid {orphan.pid})" in result.stdout
        assert orphan.wait(5) == -signal.SIGKILL
    finally:
        if orphan.poll() is None:
            orphan.kill()


@pytest.mark.parametrize("run", ["nope", "/no/such/dir"])
def test_ps_unknown_run_exit_2(run: str) -> None:
    result = lab("ps", run, env=dict(os.environ))
    assert result.returncode == 2 and "RUN" in result.stderr
