"""The stack's processes placed on Ray nodes (`lab up --ray`, `lab sweep --ray`): a topology puts
the prefill fleet on the node labelled `lab-node = "1"`, the decode fleet's 2 engines on the two
nodes with resource `lab_pair` (nodes 1 and 2: one engine on each) and the frontend on the node
with resource `node0` (tests/ray/conftest.py's 3-node cluster). Checked: ONE agent per node
(node 1 runs the prefill fleet and a decode engine under one agent); each process runs on its
node as a child of that node's agent actor; (where network namespaces are unavailable: where
test_netns_nodes.py runs it instead) a sweep through the placed
stack has 0 errors; `lab fault` kill and freeze on a Ray-node process behave as the local tests
say (tests/launch/test_cli.py::test_detach_ps_fault_down, tests/launch/test_real_topology.py::
test_real_detached_run_with_cli_fault); nothing of the run is left running afterwards."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from lab.analysis.rundir import read_requests
from lab.serve.discovery.etcd_store import EtcdRegistry
from launch import netns
from launch.events import read_events
from launch.process import ENV_RUN_DIR
from tests.launch.helpers import alive
from tests.launch.test_real_topology import complete
from tests.ray.conftest import RayCluster
from tests.ray.test_client import lab, ray_args

#: where the topology puts each process: its node (k); the decode engines are spread over
#: nodes 1 and 2 in the nodes' order (launch.ray_nodes), which this does not fix
PLACED = {"engine-prefill-0": 1, "sidecar-prefill-0": 1, "frontend": 0}
DECODE = ("decode-0", "decode-1")
TOPOLOGY = """
speedup = 0
grace_s = 5
extra_sidecar_args = ["--grace-period", "0.5"]
extra_frontend_args = ["--shutdown-grace", "0.5"]
frontend_ray_resource = "node0"
[[fleet]]
role = "prefill"
ray_labels = { lab-node = "1" }
[[fleet]]
role = "decode"
count = 2
ray_resource = "lab_pair"
"""
CONC = 4
REQUESTS = 20


@pytest.fixture(scope="module")
def topology(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("topology") / "placed.toml"
    path.write_text(TOPOLOGY)
    return path


def node_index(cluster: RayCluster, node_id: str | None) -> int | None:
    return cluster.nodes[node_id][0] if node_id in cluster.nodes else None


def of_run(run_dir: Path) -> list[int]:
    """Every live process started for this run (its LAB_RUN_DIR marker), wherever it runs."""
    marker = str(run_dir.resolve())
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(ENV_RUN_DIR) == marker and proc.status() != "zombie":
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def wait_until(check: Any, what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def registered(discovery: str) -> set[str]:
    """The worker ids in the run's etcd now."""
    async def names() -> set[str]:
        registry = EtcdRegistry.from_spec(discovery)
        try:
            return {w.worker_id for w in await registry.list()}
        finally:
            await registry.close()

    return asyncio.run(names())


def up_placed(cluster: RayCluster, topology: Path, run: Path) -> dict[str, Any]:
    """`lab up --detach` of the placed topology; its state.json."""
    up = lab("up", "--detach", "--topology", str(topology), "--ray", cluster.address,
             "--out", str(run), timeout=180)
    assert up.returncode == 0, up.stderr + (run / "supervisor.log").read_text()
    return dict(json.loads((run / "state.json").read_text()))


def assert_placed(cluster: RayCluster, state: dict[str, Any]) -> dict[int, dict]:
    """Each process on the node the topology names (the decode engines one on each of nodes 1
    and 2, each sidecar with its engine), under the ONE agent on that node; the agents by
    node (k)."""
    where = nodes_of(cluster, state)
    decode = {where[f"engine-{d}"] for d in DECODE}
    assert decode == {1, 2}, where
    assert all(where[f"sidecar-{d}"] == where[f"engine-{d}"] for d in DECODE), where
    assert {n: k for n, k in where.items() if "decode" not in n} == PLACED
    agents = {node_index(cluster, a["node_id"]): a for a in state["ray"]["agents"]}
    assert sorted(agents) == [0, 1, 2] and len(state["ray"]["agents"]) == 3
    for k, agent in agents.items():
        assert sorted(agent["processes"]) == sorted(n for n, at in where.items() if at == k)
        assert agent["address"] == cluster.nodes[agent["node_id"]][1].node_ip_address
    return agents


def nodes_of(cluster: RayCluster, state: dict[str, Any]) -> dict[str, int | None]:
    """process name -> the node (k) state.json says it runs on."""
    return {p["name"]: node_index(cluster, p["node"]) for p in state["processes"]}


@pytest.mark.skipif(netns.available()[0], reason="where namespaces are available, "
                    "test_netns_nodes.py sweeps through this topology on nodes that are hosts")
def test_sweep_through_the_stack_placed_over_three_nodes(
        ray_cluster: RayCluster, topology: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    out = lab("sweep", "--topology", str(topology), "--conc", str(CONC), "--requests",
              str(REQUESTS), "--isl", "16", "--osl", "8", "--no-plots", "--out", str(run),
              *ray_args(ray_cluster), timeout=240)
    assert out.returncode == 0, out.stderr
    req = read_requests(run)
    assert len(req) == CONC + REQUESTS
    assert req["ok"].all(), req.loc[~req["ok"], ["error_kind", "error_message"]]
    state = json.loads((run / "state.json").read_text())
    agents = assert_placed(ray_cluster, state)
    assert f"ray agent {agents[1]['agent']}: node" in out.stderr
    assert_agents_recorded(run, state)


def assert_agents_recorded(run: Path, state: dict[str, Any]) -> None:
    """The agents' events in the run's events.jsonl, each with its node; their CPU samples in
    procs.parquet, each once, on the driver's clock, and the level's server CPU from them;
    nothing of the run left afterwards."""
    import pandas as pd

    node_ids = {p["name"]: p["node"] for p in state["processes"]}
    ready = {e["name"]: e.get("node") for e in read_events(run / "events.jsonl")
             if e["event"] == "ready" and e["name"] in node_ids}
    assert ready == node_ids
    procs = pd.read_parquet(run / "procs.parquet")
    assert set(procs["name"]) == set(node_ids), set(procs["name"])
    assert not procs.duplicated(["name", "t_ns"]).any()
    assert pd.read_csv(run / "levels.csv")["server_cpu_ms_per_req"].iloc[0] > 0
    assert wait_until(lambda: not of_run(run), "the run's processes to be gone", 30)


def test_lab_fault_kill_freeze_and_an_agent_lost_on_ray_nodes(
        ray_cluster: RayCluster, topology: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    try:
        state = up_placed(ray_cluster, topology, run)
        agents = assert_placed(ray_cluster, state)
        # each process is a child of its node's agent, the Ray actor
        where = nodes_of(ray_cluster, state)
        for p in state["processes"]:
            agent = agents[where[p["name"]]]
            assert psutil.Process(p["pid"]).ppid() == agent["pid"], (p, agent)
            assert "NodeAgent" in " ".join(psutil.Process(agent["pid"]).cmdline())
        assert "ray node" in lab("ps", str(run)).stdout

        # kill: the sidecar's policy (on-failure) restarts it, on its node, under its agent
        fault = lab("fault", str(run), "--process", "sidecar-prefill-0", "--kind", "kill")
        assert fault.returncode == 0, fault.stderr

        def restarted() -> dict | None:
            info = json.loads(lab("ps", str(run), "--json").stdout)
            sidecar = next(p for p in info["processes"] if p["name"] == "sidecar-prefill-0")
            done = sidecar["restarts"] == 1 and sidecar["state"] == "ready" and sidecar["alive"]
            return sidecar if done else None

        sidecar = wait_until(restarted, "sidecar-prefill-0 restarted")
        assert psutil.Process(sidecar["pid"]).ppid() == agents[1]["pid"]
        assert node_index(ray_cluster, sidecar["node"]) == 1

        # freeze: the engine says so, its sidecar withdraws it from discovery; unfreeze: back
        assert registered(state["discovery"]) == {"sidecar-prefill-0", "sidecar-decode-0",
                                                  "sidecar-decode-1"}
        fault = lab("fault", str(run), "--process", "engine-decode-0", "--kind", "freeze")
        assert fault.returncode == 0 and "frozen" in fault.stdout, fault.stderr
        wait_until(lambda: "sidecar-decode-0" not in registered(state["discovery"]),
                   "sidecar-decode-0 withdrawn")
        fault = lab("fault", str(run), "--process", "engine-decode-0", "--kind", "unfreeze")
        assert fault.returncode == 0, fault.stderr
        wait_until(lambda: "sidecar-decode-0" in registered(state["discovery"]),
                   "sidecar-decode-0 registered again")
        assert complete(state["frontend_url"])["usage"]["completion_tokens"] == 6

        # refused as locally: an unknown process, an engine fault on the frontend
        bad = lab("fault", str(run), "--process", "engine-7", "--kind", "kill")
        assert bad.returncode == 2 and "engine-7" in bad.stderr
        notengine = lab("fault", str(run), "--process", "frontend", "--kind", "freeze")
        assert notengine.returncode == 1 and "engines" in notengine.stderr

        # the agent of node 2 killed: its processes die with it, the run goes on without them
        lost_agent = agents[2]
        kill_agent(run, state, lost_agent)
    finally:
        down = lab("down", str(run))
    assert down.returncode == 0, down.stderr
    final = json.loads((run / "state.json").read_text())
    assert final["state"] == "stopped"
    # the supervisor tore down and returned (Ray's own SIGTERM handler would have exited it)
    assert "[lab up] stopped; run dir" in (run / "supervisor.log").read_text()
    lost_names = set(lost_agent["processes"])
    assert all(p["state"] == ("exited" if p["name"] in lost_names else "stopped")
               for p in final["processes"]), final["processes"]
    # nothing of the run is left: its processes (every incarnation) and the agents
    wait_until(lambda: not of_run(run), "the run's processes to be gone", 30)
    assert not [a for a in final["ray"]["agents"] if alive(a["pid"])]
    kinds = [e.get("kind") for e in read_events(run / "events.jsonl") if e["event"] == "fault"]
    assert kinds == ["kill", "freeze", "unfreeze"]
    exits = [e for e in read_events(run / "events.jsonl")
             if e["event"] == "exit" and e["name"] == "sidecar-prefill-0"]
    assert exits[0]["code"] == -9 and node_index(ray_cluster, exits[0]["node"]) == 1
    lost = [e for e in read_events(run / "events.jsonl")
            if e["event"] == "exit" and e["name"] == lost_agent["agent"] and e.get("reason")]
    assert lost and "lost" in lost[0]["reason"]


def kill_agent(run: Path, state: dict[str, Any], agent: dict[str, Any]) -> None:
    """The processes are the actor's children: SIGKILL an agent and its processes die with it
    (lab.shared.pdeath); the run records the loss, and a fault on them is refused naming it."""
    lost_engine = next(n for n in agent["processes"] if n.startswith("engine-"))
    children = [(p["pid"], p["create_time"]) for p in state["processes"]
                if p["name"] in agent["processes"]]
    assert len(children) == 2
    psutil.Process(agent["pid"]).kill()
    wait_until(lambda: not any(alive(*c) for c in children), "the agent's children gone", 30)

    def recorded() -> dict | None:
        now = json.loads((run / "state.json").read_text())
        lost = next(a for a in now["ray"]["agents"] if a["agent"] == agent["agent"])["lost"]
        return now if lost else None

    now = wait_until(recorded, "the lost agent in state.json", 30)
    states = {p["name"]: p["state"] for p in now["processes"]}
    assert {n for n, st in states.items() if st == "exited"} == set(agent["processes"])
    assert states["engine-prefill-0"] == "ready"
    fault = lab("fault", str(run), "--process", lost_engine, "--kind", "kill")
    assert fault.returncode == 1 and "lost" in fault.stderr, fault.stderr


def test_placement_needs_ray(topology: Path, tmp_path: Path) -> None:
    for command in ("up", "sweep"):
        out = lab(command, "--topology", str(topology), "--out", str(tmp_path / command))
        assert out.returncode == 2, out.stderr
        assert "places processes on Ray nodes" in out.stderr and "--ray" in out.stderr
        assert "Traceback" not in out.stderr


@pytest.fixture(autouse=True)
def _three_nodes(ray_cluster: RayCluster) -> None:
    assert len(ray_cluster.nodes) == 3


def test_a_place_no_node_has_is_named_before_anything_starts(
        ray_cluster: RayCluster, tmp_path: Path) -> None:
    topology = tmp_path / "nowhere.toml"
    topology.write_text('[[fleet]]\nrole = "decode"\n\n[[fleet]]\nrole = "prefill"\n'
                        'ray_resource = "lab_nowhere"\nray_labels = { lab-node = "1" }\n')
    run = tmp_path / "run"
    up = lab("up", "--topology", str(topology), "--ray", ray_cluster.address, "--out", str(run),
             timeout=120)
    assert up.returncode != 0
    assert "fleet 1 (prefill): no live Ray node has resource lab_nowhere and label " \
           "lab-node=1" in up.stderr, up.stderr
    assert "Traceback" not in up.stderr
    # nothing started: no process of the run, no agent
    assert not of_run(run)
    events = read_events(run / "events.jsonl") if (run / "events.jsonl").exists() else []
    assert not [e for e in events if e["event"] == "start"], events
