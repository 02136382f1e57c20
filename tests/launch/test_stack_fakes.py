"""Supervision against stand-in processes (tests/launch/fake_proc.py): start/stop cycles,
restart policies, readiness errors, side-by-side topologies, sampler, config."""

from __future__ import annotations

import asyncio
import functools
import json
import socket
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

from launch.commands import Programs
from launch.errors import LaunchError
from launch.events import read_events
from launch.stack import Stack
from launch.topology import TopologySpec
from tests.launch.helpers import alive
from tests.waiting import wait_for as _wait_for

#: Launcher state changes take seconds (restarts with backoff): poll every 0.1 s, up to 20 s.
wait_for = functools.partial(_wait_for, timeout=20.0, interval=0.1)

pytestmark = pytest.mark.usefixtures("no_leftovers")


def health(url: str) -> int:
    with urllib.request.urlopen(f"{url}/health", timeout=5) as reply:
        return reply.status


async def test_aggregated_and_disaggregated_cycles(tmp_path: Path, fakes: Programs) -> None:
    for index, spec in enumerate([
        TopologySpec.aggregated(engines=2, grace_s=3),
        TopologySpec.disaggregated(prefill=1, decode=2, grace_s=3),
    ]):
        run_dir = tmp_path / f"run{index}"
        async with Stack(spec, run_dir, programs=fakes) as stack:
            views = {v.name: v for v in stack.processes()}
            if index == 0:
                assert set(views) == {"engine-0", "engine-1", "sidecar-0", "sidecar-1",
                                      "frontend"}
            else:
                assert set(views) == {"engine-prefill-0", "engine-decode-0", "engine-decode-1",
                                      "sidecar-prefill-0", "sidecar-decode-0",
                                      "sidecar-decode-1", "frontend"}
            assert all(v.state == "ready" and v.address for v in views.values())
            assert len({v.address for v in views.values()}) == len(views)  # distinct ports
            assert await asyncio.to_thread(health, stack.frontend_url) == 200
            pids = [(v.pid, v.create_time) for v in views.values()]
            # the sidecar's --engine is its engine's reported address
            sidecar = "sidecar-0" if index == 0 else "sidecar-decode-1"
            engine = sidecar.replace("sidecar", "engine")
            log = (run_dir / "logs" / f"{sidecar}.log").read_text()
            assert f"--engine {views[engine].address}" in log
            assert (views[engine].instance_id or "").startswith(f"{engine}-")
        assert not any(alive(pid, ct) for pid, ct in pids)
        events = read_events(run_dir / "events.jsonl")
        exits = {e["name"]: e["code"] for e in events if e["event"] == "exit"}
        assert set(exits) == set(views) and set(exits.values()) == {0}
        state = json.loads((run_dir / "state.json").read_text())
        assert state["state"] == "stopped"


async def test_sidecar_exit_1_is_restarted_and_registers_again(
    tmp_path: Path, fakes: Programs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_TRIGGER_DIR", str(tmp_path))
    run_dir = tmp_path / "run"
    spec = TopologySpec.aggregated(grace_s=3)
    async with Stack(spec, run_dir, programs=fakes) as stack:
        first_pid = next(v.pid for v in stack.processes() if v.name == "sidecar-0")
        (tmp_path / "exit-sidecar-0").touch()  # the fake sidecar withdraws and exits 1

        def restarted_and_ready() -> bool:
            v = next(v for v in stack.processes() if v.name == "sidecar-0")
            return v.restarts == 1 and v.state == "ready"

        await wait_for(restarted_and_ready)
        record = json.loads((run_dir / "discovery" / "sidecar-0.json").read_text())
        new_pid = next(v.pid for v in stack.processes() if v.name == "sidecar-0")
        assert record["pid"] == new_pid != first_pid
    events = [e for e in read_events(run_dir / "events.jsonl") if e["name"] == "sidecar-0"]
    kinds = [(e["event"], e["code"]) for e in events
             if e["event"] not in ("registered", "withdrawn")]
    assert kinds[:6] == [("start", None), ("ready", None), ("exit", 1), ("restart", 1),
                         ("start", None), ("ready", None)], kinds
    restart = next(e for e in events if e["event"] == "restart")
    assert restart["delay_s"] == 0.5
    # discovery as events, on the same clock: registered, withdrawn (before the exit), back
    registry = [(e["event"], e["pid"]) for e in events if e["event"] in ("registered",
                                                                         "withdrawn")]
    assert registry[:3] == [("registered", first_pid), ("withdrawn", first_pid),
                            ("registered", new_pid)], registry
    t = {(e["event"], e["pid"]): e["t_ns"] for e in events}
    assert t[("withdrawn", first_pid)] <= t[("exit", first_pid)] + 200_000_000


async def test_engine_restart_policy_gives_new_instance_and_sidecar_follows(
    tmp_path: Path, fakes: Programs
) -> None:
    spec = TopologySpec.aggregated(grace_s=3, restart_engine="on-failure")
    async with Stack(spec, tmp_path / "run", programs=fakes) as stack:
        before = {v.name: v for v in stack.processes()}
        await stack.fault("engine-0", "kill")

        def back() -> bool:
            now = {v.name: v for v in stack.processes()}
            return (now["engine-0"].restarts == 1 and now["engine-0"].state == "ready"
                    and now["sidecar-0"].restarts >= 1 and now["sidecar-0"].state == "ready")

        await wait_for(back)
        after = {v.name: v for v in stack.processes()}
        assert after["engine-0"].instance_id != before["engine-0"].instance_id
        # a restarted engine asks for its previous port: its sidecar's --engine stays valid
        assert after["engine-0"].address == before["engine-0"].address
        assert await asyncio.to_thread(health, stack.frontend_url) == 200

        # the port is taken meanwhile: the next attempt takes any port, the sidecar follows
        address = after["engine-0"].address
        blocker = socket.socket()
        try:
            await stack.fault("engine-0", "kill")
            for _ in range(50):
                try:
                    blocker.bind(("127.0.0.1", int(address.rpartition(":")[2])))
                    break
                except OSError:
                    await asyncio.sleep(0.01)
            blocker.listen()

            def moved() -> bool:
                now = {v.name: v for v in stack.processes()}
                return (now["engine-0"].state == "ready" and now["engine-0"].address != address
                        and now["sidecar-0"].state == "ready")

            await wait_for(moved, timeout=30)
        finally:
            blocker.close()
        final = {v.name: v for v in stack.processes()}
        assert final["engine-0"].restarts == 3
        log = (tmp_path / "run" / "logs" / "sidecar-0.log").read_text()
        assert f"--engine {final['engine-0'].address}" in log  # restarted with the new address
        assert await asyncio.to_thread(health, stack.frontend_url) == 200
    events = read_events(tmp_path / "run" / "events.jsonl")
    assert ("fault", "engine-0", "kill") in {(e["event"], e["name"], e.get("kind")) for e in events}
    assert any(e["event"] == "exit" and e["name"] == "engine-0" and e["code"] == -9
               for e in events)


async def test_engine_never_policy_stays_down_but_restart_fault_restarts(
    tmp_path: Path, fakes: Programs
) -> None:
    spec = TopologySpec.aggregated(engines=2, grace_s=3)
    async with Stack(spec, tmp_path / "run", programs=fakes) as stack:
        await stack.fault("engine-1", "restart")  # requested: restarts whatever the policy
        await wait_for(lambda: {v.name: v for v in stack.processes()}["engine-1"].restarts == 1
                       and {v.name: v for v in stack.processes()}["engine-1"].state == "ready")
        await stack.fault("engine-0", "kill")  # policy never: stays down
        await wait_for(lambda: {v.name: v for v in stack.processes()}["engine-0"].state
                       == "exited")
        await asyncio.sleep(1.0)
        assert {v.name: v for v in stack.processes()}["engine-0"].restarts == 0
        with pytest.raises(RuntimeError, match="not running"):
            await stack.fault("engine-0", "kill")
        # a restart fault brings the exited engine back, on its port, and its sidecar serves
        old_address = {v.name: v for v in stack.processes()}["engine-0"].address
        assert "starting it again" in await stack.fault("engine-0", "restart")
        await wait_for(lambda: {v.name: v for v in stack.processes()}["engine-0"].state
                       == "ready")
        await wait_for(lambda: {v.name: v for v in stack.processes()}["sidecar-0"].state
                       == "ready")
        assert {v.name: v for v in stack.processes()}["engine-0"].address == old_address
        with pytest.raises(KeyError, match="engine-9"):
            await stack.fault("engine-9", "kill")
        with pytest.raises(ValueError, match="engines"):
            await stack.fault("frontend", "freeze")


async def test_never_ready_names_the_process_with_its_log(
    tmp_path: Path, fakes: Programs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_NEVER_READY", "sidecar-decode-0")
    spec = TopologySpec.disaggregated(ready_timeout_s=4, grace_s=2)
    with pytest.raises(LaunchError) as err:
        async with Stack(spec, tmp_path / "run", programs=fakes):
            pass
    assert err.value.name == "sidecar-decode-0"
    assert "not ready within 4 s" in str(err.value)
    assert "hanging on purpose" in err.value.log_tail
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    assert state["state"] == "failed" and "sidecar-decode-0" in state["error"]


async def test_exit_before_ready_names_the_process_at_once(
    tmp_path: Path, fakes: Programs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_FAIL_START", "engine-1")
    spec = TopologySpec.aggregated(engines=2, ready_timeout_s=30, grace_s=2)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(LaunchError) as err:
        async with Stack(spec, tmp_path / "run", programs=fakes):
            pass
    assert loop.time() - started < 20  # did not wait for the timeout
    assert err.value.name == "engine-1"
    assert "exited with code 3" in str(err.value)
    assert "failing on purpose: bad configuration" in str(err.value)


async def test_teardown_kills_what_ignores_sigterm(
    tmp_path: Path, fakes: Programs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_IGNORE_TERM", "engine-0")
    spec = TopologySpec.aggregated(grace_s=1)
    async with Stack(spec, tmp_path / "run", programs=fakes) as stack:
        await stack.fault("sidecar-0", "stop")  # a stopped process must still go away
    events = read_events(tmp_path / "run" / "events.jsonl")
    assert any(e["event"] == "kill" and e["name"] == "engine-0" for e in events)
    assert {e["name"]: e["code"] for e in events if e["event"] == "exit"}["engine-0"] == -9


async def test_two_topologies_side_by_side(tmp_path: Path, fakes: Programs) -> None:
    a = Stack(TopologySpec.aggregated(grace_s=3), tmp_path / "a", programs=fakes)
    b = Stack(TopologySpec.aggregated(grace_s=3), tmp_path / "b", programs=fakes)
    async with a, b:
        ports_a = {v.address for v in a.processes()}
        ports_b = {v.address for v in b.processes()}
        assert not ports_a & ports_b
        assert a.frontend_url != b.frontend_url
        assert await asyncio.to_thread(health, a.frontend_url) == 200
        assert await asyncio.to_thread(health, b.frontend_url) == 200
        # each run has its own discovery: b's frontend saw only b's worker
        assert list((tmp_path / "a" / "discovery").glob("*.json")) != []


async def test_sampler_and_config(tmp_path: Path, fakes: Programs) -> None:
    run_dir = tmp_path / "run"
    async with Stack(TopologySpec.aggregated(grace_s=3), run_dir, programs=fakes,
                     sample_interval_s=0.2) as stack:
        # the sampler's own ticks (a process's first one primes its counter), not a guessed time
        assert stack.sampler is not None
        sampler = stack.sampler
        await wait_for(lambda: {s["name"] for s in sampler.samples} >= {
            "engine-0", "sidecar-0", "frontend"}, what="a background sample of each process")
        samples = stack.cpu_samples()
    names = {s["name"] for s in samples}
    assert {"engine-0", "sidecar-0", "frontend"} <= names
    assert all(s["rss_bytes"] > 1_000_000 and s["cpu_pct"] >= 0 for s in samples)
    frame = pd.read_parquet(run_dir / "procs.parquet")
    assert list(frame.columns) == ["t_ns", "wall", "name", "role", "pid", "cpu_pct",
                                   "cpu_wait_pct", "rss_bytes"]
    assert len(frame) >= len(samples)
    assert set(frame["role"]) == {"engine", "sidecar", "frontend"}
    config = json.loads((run_dir / "config.json").read_text())
    assert config["topology"]["fleets"][0]["role"] == "aggregated"
    assert config["topology"]["discovery"].startswith("file:")
    assert config["versions"]["python"] and config["versions"]["packages"]["grpcio"]
    assert config["machine"]["cpu_count"] >= 1 and config["machine"]["kernel"]
    assert "commit" in config["git"]


async def test_a_level_shorter_than_the_sample_interval_has_its_cpu_figures(
        tmp_path: Path, fakes: Programs) -> None:
    """A sweep asks for the samples when a level ends: one is taken then, so a level that ended
    before the sampler's next tick still gets each process's CPU (a quiet machine runs a
    small level in well under the 0.5 s interval)."""
    from lab.analysis.metrics import process_figures

    async with Stack(TopologySpec.aggregated(grace_s=3), tmp_path / "run", programs=fakes,
                     sample_interval_s=3600) as stack:
        # before the level: each process sampled (the first call primes its counter)
        await wait_for(lambda: {s["name"] for s in stack.cpu_samples()} >= {
            "engine-0", "sidecar-0", "frontend"})
        start = time.perf_counter_ns()
        assert await asyncio.to_thread(health, stack.frontend_url) == 200
        end = time.perf_counter_ns()
        samples = stack.cpu_samples()  # the level's end, long before the next tick
    figures = process_figures(pd.DataFrame(samples), start, end, (end - start) / 1e9, ok=1)
    assert {"cpu_pct:engine-0", "cpu_pct:sidecar-0", "cpu_pct:frontend"} <= set(figures)
