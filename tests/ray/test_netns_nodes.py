"""Ray nodes that are separate hosts: a head in the root namespace (on the bridge's address) and
two workers each in its own network namespace (launch.netns.NetworkLab), started with
`ip netns exec NS ray start --block --address HEAD --node-ip-address 10.213.N.x`, so every node
has its own IP. The placed stack (tests/ray/test_stack.py's topology: prefill on node 1, the 2
decode engines one on each worker, the frontend on the head) serves a sweep with 0 errors, and
every process binds and advertises its own node's address; etcd listens on the bridge.

Each `ray start --block` runs in its own process group, SIGKILLed at the end (a SIGTERM makes a
node drain for up to 30 s), also on failure, and then any process left whose command line names
the cluster's own temp dir; never `ray stop`, which stops every Ray process on the machine. Skipped
where namespaces are unavailable (not root)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from lab.analysis.rundir import read_requests
from launch import netns
from tests.ray.conftest import CLIENT_RESOURCE, PAIR_RESOURCE
from tests.ray.test_client import lab
from tests.ray.test_stack import TOPOLOGY, assert_agents_recorded, wait_until

ok, why = netns.available()
pytestmark = pytest.mark.skipif(not ok, reason=f"network namespaces unavailable: {why}")

RAY = str(Path(sys.executable).parent / "ray")
WORKERS = ("n1", "n2")
STARTED = "Ray runtime started"


@dataclass
class NetnsCluster:
    lab: netns.NetworkLab
    #: the head's --temp-dir: short (Ray's socket paths must fit 107 bytes) and the cluster's own
    temp: str
    address: str = ""
    procs: list[subprocess.Popen] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)

    def node_address(self, k: int) -> str:
        return self.lab.gateway if k == 0 else self.lab.address(WORKERS[k - 1])

    def start(self, k: int, log: Path, env: dict[str, str]) -> None:
        pair = {PAIR_RESOURCE: 1} if k else {}
        resources = json.dumps({f"node{k}": 1, CLIENT_RESOURCE: 1, **pair})
        argv = [RAY, "start", "--block", "--num-cpus", "1", "--resources", resources,
                "--labels", f"lab-node={k}", "--object-store-memory", str(80 * 1024 * 1024),
                "--node-ip-address", self.node_address(k), "--disable-usage-stats"]
        if k == 0:
            argv += ["--head", "--port", "0", "--include-dashboard=false",
                     "--temp-dir", self.temp]
        else:
            argv = self.lab.exec_prefix(WORKERS[k - 1]) + argv + ["--address", self.address]
        self.logs.append(log)
        with log.open("w") as out:
            self.procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                               env=env, start_new_session=True))

    def wait_started(self, k: int, timeout: float = 90) -> str:
        def started() -> str | None:
            text = self.logs[k].read_text()
            assert self.procs[k].poll() is None, f"ray node {k} exited:\n{text[-3000:]}"
            return text if STARTED in text else None

        return str(wait_until(started, f"ray node {k} to start", timeout))

    def stop(self) -> None:
        for proc in self.procs:
            with _gone():
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for proc in psutil.process_iter():
            try:
                if any(self.temp in arg for arg in proc.cmdline()):
                    proc.kill()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue


class _gone:
    """Suppress ProcessLookupError (the group is already gone)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, *_: object) -> bool:
        return kind is ProcessLookupError


@pytest.fixture(scope="module")
def netns_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsCluster]:
    base = tmp_path_factory.mktemp("netns-ray")
    # one auth mode for the nodes and the lab's drivers (this module's `lab` commands)
    saved = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    lab_ = netns.NetworkLab(list(WORKERS))
    cluster = NetnsCluster(lab_, tempfile.mkdtemp(prefix="rayns"))
    try:
        lab_.create()
        cluster.start(0, base / "head.log", env)
        m = re.search(r"--address='([^']+)'", cluster.wait_started(0))
        assert m, cluster.logs[0].read_text()
        cluster.address = m.group(1)
        for k in range(1, len(WORKERS) + 1):  # one at a time: at once, one timed out
            cluster.start(k, base / f"{WORKERS[k - 1]}.log", env)
            cluster.wait_started(k)
        yield cluster
    finally:
        cluster.stop()
        lab_.destroy()
        shutil.rmtree(cluster.temp, ignore_errors=True)
        if saved is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = saved


def test_sweep_on_nodes_in_namespaces(netns_cluster: NetnsCluster, tmp_path: Path) -> None:
    topology = tmp_path / "placed.toml"
    topology.write_text(TOPOLOGY)
    run = tmp_path / "run"
    out = lab("sweep", "--topology", str(topology), "--conc", "4", "--requests", "20",
              "--isl", "16", "--osl", "8", "--no-plots", "--out", str(run),
              "--ray", netns_cluster.address, timeout=240)
    assert out.returncode == 0, out.stderr
    req = read_requests(run)
    assert len(req) == 24 and req["ok"].all(), req.loc[~req["ok"], ["error_message"]]
    state = json.loads((run / "state.json").read_text())
    # the node of each agent by its address; one agent per node, each with its own address
    by_address = {netns_cluster.node_address(k): k for k in range(len(WORKERS) + 1)}
    agents = {a["node_id"]: a for a in state["ray"]["agents"]}
    assert sorted(by_address[a["address"]] for a in agents.values()) == [0, 1, 2], agents
    where = {p["name"]: by_address[agents[p["node"]]["address"]] for p in state["processes"]}
    assert where["engine-prefill-0"] == where["sidecar-prefill-0"] == 1
    assert {where["engine-decode-0"], where["engine-decode-1"]} == {1, 2}
    assert where["frontend"] == 0
    # every process binds and advertises its node's address, never loopback
    for p in state["processes"]:
        host = p["address"].rpartition(":")[0]
        assert host == netns_cluster.node_address(where[p["name"]]), p
    assert state["frontend_url"].startswith(f"http://{netns_cluster.lab.gateway}:")
    # etcd, on the bridge: the sidecars in the namespaces reached it
    assert state["discovery"].startswith(f"etcd://{netns_cluster.lab.gateway}:")
    # as test_stack.py's sweep (skipped where this runs)
    assert "ray agent ray-" in out.stderr
    assert_agents_recorded(run, state)
