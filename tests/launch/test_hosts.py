"""Topologies with hosts: the real fleet inside network namespaces joined by veth links.

Skipped with netns.available()'s reason where namespaces cannot be made (not root, no `ip`);
CI runs as root and runs them.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from launch import netns
from launch.errors import LaunchError, TopologyError
from launch.events import read_events
from launch.stack import Stack
from launch.topology import TopologySpec
from tests.launch.helpers import alive
from tests.waiting import wait_for as _wait_for

#: The predicates probe processes over HTTP (blocking): in a thread, every 0.1 s, up to 30 s.
wait_for = functools.partial(_wait_for, timeout=30.0, interval=0.1, in_thread=True)

OK, REASON = netns.available()
NETEM, _ = netns.netem_available() if OK else (False, "")
pytestmark = [
    pytest.mark.skipif(not OK, reason=f"needs network namespaces: {REASON}"),
    pytest.mark.usefixtures("no_leftovers"),
]
LAB = str(Path(sys.executable).with_name("lab"))
FAST = """
speedup = 0
grace_s = 8
extra_sidecar_args = ["--grace-period", "0.3"]
extra_frontend_args = ["--shutdown-grace", "0.3", "--debug-endpoints"]
"""


def topology(tmp_path: Path, text: str, name: str = "hosts.toml") -> TopologySpec:
    path = tmp_path / name
    path.write_text(FAST + text)
    return TopologySpec.from_toml(path)


def two_hosts(gpu1: str = "") -> str:
    return f"""
frontend_host = "fe"
[[fleet]]
role = "aggregated"
host = "gpu1"
[hosts.fe]
[hosts.gpu1]
{gpu1}
"""


def complete(url: str, prompt: str | list[int] = "one two three four", max_tokens: int = 6,
             timeout: float = 30) -> dict:
    body = {"model": "mocker-model", "prompt": prompt, "max_tokens": max_tokens}
    request = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        assert reply.status == 200
        return json.loads(reply.read())


def served(url: str) -> bool:
    try:
        return complete(url, timeout=5)["usage"]["completion_tokens"] == 6
    except OSError:
        return False


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.loads(reply.read())


def tcp_in(namespace: str) -> list[dict]:
    """Established TCP connections seen inside a namespace: local, peer, mss."""
    out = subprocess.run(["ip", "netns", "exec", namespace, "ss", "-tnHi", "state", "established"],
                         capture_output=True, text=True, check=True).stdout
    conns, current = [], None
    for line in out.splitlines():
        fields = line.split()
        if line[:1].strip() and len(fields) >= 4:  # "Recv-Q Send-Q Local Peer"
            current = {"local": fields[2], "peer": fields[3], "mss": None}
            conns.append(current)
        elif current is not None and (m := re.search(r"\smss:(\d+)", line)):
            current["mss"] = int(m.group(1))
    return conns


def lab_objects(run_id: str) -> list[str]:
    """Namespaces and links of one run that still exist."""
    found = netns.find_leftovers(include_live=True)
    return [n for n in (*found.namespaces, *found.links) if run_id in n]


def network_event(run_dir: Path) -> dict:
    return next(e for e in read_events(run_dir / "events.jsonl")
                if e["event"] == "start" and e["name"] == "network")


async def test_two_hosts_serve_over_the_veth_link(tmp_path: Path) -> None:
    spec = topology(tmp_path, two_hosts())
    run_dir = tmp_path / "run"
    async with Stack(spec, run_dir) as stack:
        views = {v.name: v for v in stack.processes()}
        fe, gpu1 = stack.placement.addresses["fe"], stack.placement.addresses["gpu1"]
        gateway = stack.placement.gateway
        assert gateway and fe != gpu1
        assert all(ipaddress.ip_address(a) in netns.LAB_RANGE for a in (fe, gpu1, gateway))
        assert views["frontend"].host == "fe" and views["engine-0"].host == "gpu1"
        assert views["engine-0"].address.startswith(gpu1 + ":")
        assert stack.frontend_url == f"http://{views['frontend'].address}"
        assert views["frontend"].address.startswith(fe + ":")

        # the sidecar registered its address on gpu1 (not loopback)
        record = json.loads((run_dir / "discovery" / "sidecar-0.json").read_text())
        assert record["address"] == views["sidecar-0"].address
        assert record["address"].startswith(gpu1 + ":")

        for _ in range(3):
            reply = await asyncio.to_thread(complete, stack.frontend_url)
            assert reply["usage"]["completion_tokens"] == 6

        # the load generator (root namespace) reaches the frontend over the bridge ...
        conn = await asyncio.to_thread(get_json, stack.frontend_url + "/debug/conn")
        assert conn["peer"][0] == gateway
        # ... and the frontend's request-plane connection runs from fe to gpu1 over a
        # 1500-byte-MTU link (MSS 1448 with timestamps; loopback's would be ~65483)
        conns = tcp_in(stack.placement.namespaces["fe"])
        plane = [c for c in conns if c["peer"] == record["address"]]
        assert plane, conns
        assert all(c["local"].startswith(fe + ":") for c in plane)
        assert all(c["mss"] is not None and c["mss"] <= 1460 for c in plane), plane

        # faults, restarts and CPU sampling work on processes inside hosts
        assert "frozen" in await stack.fault("engine-0", "freeze")
        await stack.fault("engine-0", "unfreeze")
        first = views["sidecar-0"].pid
        await stack.fault("sidecar-0", "kill")
        await wait_for(lambda: (v := {p.name: p for p in stack.processes()}["sidecar-0"])
                       .restarts == 1 and v.state == "ready")
        record = json.loads((run_dir / "discovery" / "sidecar-0.json").read_text())
        assert record["pid"] != first and record["address"].startswith(gpu1 + ":")
        await wait_for(lambda: served(stack.frontend_url), timeout=15)
        await wait_for(lambda: {s["name"] for s in stack.cpu_samples()} >= {
            "engine-0", "sidecar-0", "frontend"}, timeout=10)
        pids = [(v.pid, v.create_time) for v in stack.processes()]
        run_id = network_event(run_dir)["run_id"]
        assert len(lab_objects(run_id)) == 5  # 2 namespaces, 2 veths, the bridge

    # teardown: no process, namespace, link or ownership record left
    assert not any(alive(*p) for p in pids)
    assert lab_objects(run_id) == []
    assert not (netns.STATE_DIR / f"{run_id}.json").exists()
    events = [e["name"] for e in read_events(run_dir / "events.jsonl") if e["event"] == "exit"]
    assert events[-1] == "network"  # removed after every process


async def test_rate_limit_shows_in_a_large_transfer(tmp_path: Path) -> None:
    """The prompt (a request-plane REQUEST of ~140 KB) crosses gpu1's 2 mbit link: >= ~0.5 s."""
    spec = topology(tmp_path, two_hosts('rate = "2mbit"'))
    prompt = [10000 + i for i in range(24000)]
    payload_bits = len(json.dumps(prompt).encode()) * 8
    expected_s = payload_bits / 2e6
    async with Stack(spec, tmp_path / "run") as stack:
        await asyncio.to_thread(complete, stack.frontend_url, [5, 6, 7], 1)  # warm connection
        t0 = time.perf_counter()
        reply = await asyncio.to_thread(complete, stack.frontend_url, prompt, 1, 60)
        elapsed = time.perf_counter() - t0
        assert reply["usage"]["prompt_tokens"] == len(prompt)
        veth = f"{netns.PREFIX}{network_event(tmp_path / 'run')['run_id']}v1"
        stats = subprocess.run(["tc", "-s", "qdisc", "show", "dev", veth],
                               capture_output=True, text=True, check=True).stdout
    # the token bucket lets a 16 KiB burst through at once; the rest waits for tokens
    assert 0.7 * expected_s <= elapsed <= 10 * expected_s + 5, (elapsed, expected_s)
    assert "tbf" in stats and "rate 2Mbit" in stats, stats


def test_delay_is_refused_with_the_reason(tmp_path: Path) -> None:
    if NETEM:
        pytest.skip("this kernel has netem: delay is allowed (see test_delay_shows_in_ttft)")
    path = tmp_path / "delay.toml"
    path.write_text(two_hosts('delay = "0.25ms"'))
    line = path.read_text().splitlines().index('delay = "0.25ms"') + 1
    with pytest.raises(TopologyError) as info:
        TopologySpec.from_toml(path)
    message = str(info.value)
    assert f"{path}:{line}:" in message and "hosts.gpu1" in message and "delay" in message
    assert netns.NO_NETEM in message
    # the command refuses it before starting anything (exit 2, no traceback)
    before = netns.find_leftovers(include_live=True)
    up = subprocess.run([LAB, "up", "--topology", str(path), "--out", str(tmp_path / "run")],
                        capture_output=True, text=True, timeout=60)
    assert up.returncode == 2 and netns.NO_NETEM in up.stderr, up.stderr
    assert "Traceback" not in up.stderr
    # a spec built in code is refused by the Stack, also before anything starts
    spec = TopologySpec.from_toml(path, check_system=False)
    with pytest.raises(LaunchError, match="netem"):
        asyncio.run(Stack(spec, tmp_path / "run2").__aenter__())
    assert netns.find_leftovers(include_live=True) == before


@pytest.mark.skipif(not NETEM, reason="this kernel has no netem qdisc (delay is refused)")
async def test_delay_shows_in_ttft(tmp_path: Path) -> None:
    spec = topology(tmp_path, two_hosts('delay = "20ms"'))
    async with Stack(spec, tmp_path / "run") as stack:
        await asyncio.to_thread(complete, stack.frontend_url)
        t0 = time.perf_counter()
        await asyncio.to_thread(complete, stack.frontend_url, "a b", 1)
        # frontend -> sidecar -> frontend crosses gpu1's link twice, each way delayed
        assert time.perf_counter() - t0 >= 0.035


def test_crashed_run_leftovers_are_removed_by_lab_clean(tmp_path: Path) -> None:
    path = tmp_path / "hosts.toml"
    path.write_text(FAST + two_hosts())
    run_dir = tmp_path / "run"
    up = subprocess.run([LAB, "up", "--detach", "--topology", str(path), "--out", str(run_dir)],
                        capture_output=True, text=True, timeout=90)
    run_id = network_event(run_dir)["run_id"]
    try:
        assert up.returncode == 0, up.stderr
        state = json.loads((run_dir / "state.json").read_text())
        assert "gpu1" in up.stdout  # the process table shows the hosts
        assert complete(state["frontend_url"])["usage"]["completion_tokens"] == 6
        os.kill(state["supervisor_pid"], signal.SIGKILL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(
                alive(p["pid"], p["create_time"]) for p in state["processes"]):
            time.sleep(0.1)
        assert len(lab_objects(run_id)) == 5  # the network outlives its launcher ...
        found = netns.find_leftovers()
        assert run_id in found.runs
        dry = subprocess.run([LAB, "clean", "--results", str(tmp_path), "--dry-run"],
                             capture_output=True, text=True, timeout=60)
        assert f"would remove namespace llab-{run_id}-gpu1" in dry.stdout, dry.stdout
        assert len(lab_objects(run_id)) == 5
        clean = subprocess.run([LAB, "clean", "--results", str(tmp_path)],
                               capture_output=True, text=True, timeout=60)
        assert clean.returncode == 0, clean.stderr
        assert f"removed namespace llab-{run_id}-fe" in clean.stdout, clean.stdout
        assert f"removed link llab{run_id}br" in clean.stdout
        assert lab_objects(run_id) == []
        assert not any(alive(p["pid"], p["create_time"]) for p in state["processes"])
    finally:
        if lab_objects(run_id):
            netns.clean_leftovers()
