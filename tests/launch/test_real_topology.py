"""The launcher with the real fleet: `mocker serve`, `lab sidecar`, `lab frontend`."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from launch.events import read_events
from launch.stack import Stack
from launch.topology import TopologySpec
from tests.launch.helpers import alive
from tests.waiting import wait_for as _wait_for

#: The predicates probe processes over HTTP (blocking): in a thread, every 0.1 s, up to 30 s.
wait_for = functools.partial(_wait_for, timeout=30.0, interval=0.1, in_thread=True)

pytestmark = [pytest.mark.usefixtures("no_leftovers")]
LAB = str(Path(sys.executable).with_name("lab"))
FAST = dict(speedup=0, grace_s=8, extra_sidecar_args=["--grace-period", "0.5"],
            extra_frontend_args=["--shutdown-grace", "0.5"])


def real_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("LAB_LAUNCH_MOCKER", None)
    env.pop("LAB_LAUNCH_LAB", None)
    return env


def complete(url: str, max_tokens: int = 6, stream: bool = False) -> dict | list[str]:
    body = {"model": "mocker-model", "prompt": "one two three four", "max_tokens": max_tokens,
            "stream": stream}
    request = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=20) as reply:
        assert reply.status == 200
        if stream:
            return [line for line in reply.read().decode().splitlines() if line.startswith("data:")]
        return json.loads(reply.read())


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


async def test_real_aggregated_then_disaggregated(tmp_path: Path) -> None:
    for index, spec in enumerate([TopologySpec.aggregated(engines=2, **FAST),
                                  TopologySpec.disaggregated(**FAST)]):
        async with Stack(spec, tmp_path / f"run{index}") as stack:
            reply = await asyncio.to_thread(complete, stack.frontend_url)
            assert reply["usage"]["completion_tokens"] == 6
            chunks = await asyncio.to_thread(complete, stack.frontend_url, 6, True)
            assert chunks[-1] == "data: [DONE]"
            pids = [(v.pid, v.create_time) for v in stack.processes()]
        assert not any(alive(*p) for p in pids)


async def test_a_stack_that_served_nothing_stops_without_the_sidecar_grace(
        tmp_path: Path) -> None:
    """No request ever reached the sidecar, so no frontend ever connected to it and its grace
    could not end early; the launcher sends it a second SIGTERM once the frontend has exited,
    and the stack stops long before the 60 s grace (and the launcher's 30 s SIGKILL)."""
    spec = TopologySpec.aggregated(speedup=0, grace_s=30,
                                   extra_sidecar_args=["--grace-period", "60"])
    async with Stack(spec, tmp_path / "run") as stack:
        pids = [(v.pid, v.create_time) for v in stack.processes()]
        stopping = time.monotonic()
    assert time.monotonic() - stopping < 15, "the sidecar waited out its grace period"
    assert not any(alive(*p) for p in pids)
    events = read_events(tmp_path / "run" / "events.jsonl")
    assert not [e for e in events if e["event"] == "kill"], events
    exits = {e["name"]: e["code"] for e in events if e["event"] == "exit"}
    assert exits == {"frontend": 0, "sidecar-0": 0, "engine-0": 0}
    log = (tmp_path / "run" / "logs" / "sidecar-0.log").read_text()
    assert "SIGTERM received again: no grace period, no drain" in log


async def test_real_engine_loss_restarts_sidecar_which_registers_again(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    async with Stack(TopologySpec.disaggregated(**FAST), run_dir) as stack:
        def sidecar():
            return {v.name: v for v in stack.processes()}["sidecar-decode-0"]

        first_pid = sidecar().pid
        await stack.fault("engine-decode-0", "not-serving")
        await wait_for(lambda: sidecar().restarts == 1)
        await stack.fault("engine-decode-0", "serving")
        await wait_for(lambda: sidecar().state == "ready")
        await wait_for(lambda: healthy(stack.frontend_url))
        reply = await asyncio.to_thread(complete, stack.frontend_url)
        assert reply["usage"]["completion_tokens"] == 6
        second_pid = sidecar().pid
    log = (run_dir / "logs" / "sidecar-decode-0.log").read_text()
    assert "engine lost" in log
    events = [e for e in read_events(run_dir / "events.jsonl")
              if e["name"] in ("sidecar-decode-0", "engine-decode-0")]
    seq = [(e["event"], e["name"], e["pid"], e["code"]) for e in events
           if e["event"] in ("fault", "withdrawn", "exit", "restart", "registered")]
    # the worker left discovery while its process was still running, then it exited 1
    assert seq[:5] == [
        ("registered", "sidecar-decode-0", first_pid, None),
        ("fault", "engine-decode-0", seq[1][2], None),
        ("withdrawn", "sidecar-decode-0", first_pid, None),
        ("exit", "sidecar-decode-0", first_pid, 1),
        ("restart", "sidecar-decode-0", first_pid, 1),
    ], seq
    assert ("registered", "sidecar-decode-0", second_pid, None) in seq


def test_real_detached_run_with_cli_fault(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    env = real_env()

    def lab(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([LAB, *args], env=env, capture_output=True, text=True, timeout=60)

    up = lab("up", "--detach", "--engines", "1", "--speedup", "0", "--out", str(run_dir))
    try:
        assert up.returncode == 0, up.stderr
        state = json.loads((run_dir / "state.json").read_text())
        url = state["frontend_url"]
        assert json.loads(urllib.request.urlopen(url + "/v1/models", timeout=5).read())
        def observed(want: dict[str, str]) -> None:
            deadline = time.monotonic() + 30
            while True:
                info = json.loads(lab("ps", str(run_dir), "--json").stdout)
                seen = {p["name"]: p["observed"] for p in info["processes"]}
                if all(seen.get(k) == v for k, v in want.items()):
                    return
                assert time.monotonic() < deadline, seen
                time.sleep(0.2)

        fault = lab("fault", str(run_dir), "--process", "engine-0", "--kind", "freeze")
        assert fault.returncode == 0 and "frozen" in fault.stdout, fault.stderr
        # Even idle, a frozen engine leaves rotation (its load clock stopped): ps says so.
        observed({"engine-0": "stalled", "sidecar-0": "withdrawn"})
        assert "stalled" in lab("ps", str(run_dir)).stdout
        fault = lab("fault", str(run_dir), "--process", "engine-0", "--kind", "unfreeze")
        assert fault.returncode == 0, fault.stderr
        observed({"engine-0": "ready", "sidecar-0": "ready"})
        assert complete(url)["usage"]["completion_tokens"] == 6
        ps = lab("ps", str(run_dir))
        assert "engine-0" in ps.stdout and "ready" in ps.stdout
    finally:
        down = lab("down", str(run_dir))
    assert down.returncode == 0, down.stderr
    assert not any(alive(p["pid"], p["create_time"]) for p in state["processes"])
    kinds = [e.get("kind") for e in read_events(run_dir / "events.jsonl")
             if e["event"] == "fault"]
    assert kinds == ["freeze", "unfreeze"]
