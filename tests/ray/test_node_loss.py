"""A client node lost mid-level (`ray.cluster_utils.Cluster.remove_node`, a hard kill): the
requests of its actor that never came back are records with error_kind `client_lost` and the
reason, the level still reports, and the sweep's other levels run on the actors left. The node
is added back afterwards, so the session's cluster keeps its three nodes."""

from __future__ import annotations

import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from lab.analysis.rundir import read_requests
from lab.load.ray_client import LOST_KIND
from tests.ray.conftest import RayCluster
from tests.ray.test_client import lab_argv, ray_args

CONC = 6
REQUESTS = 150


def finished(url: str) -> int:
    """Requests the frontend finished so far (its /metrics counter)."""
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith("lab_frontend_requests_total{"))


def wait_line(proc: subprocess.Popen, pattern: str, lines: list[str], timeout: float) -> re.Match:
    assert proc.stderr is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            raise AssertionError("lab sweep ended early:\n" + "".join(lines))
        lines.append(line)
        m = re.search(pattern, line)
        if m:
            return m
    raise AssertionError(f"no line matching {pattern!r} within {timeout} s:\n" + "".join(lines))


def test_node_lost_mid_level(ray_cluster: RayCluster, tmp_path: Path) -> None:
    run = tmp_path / "run"
    # engines at real speed (speedup 1, a decode step of milliseconds): the level lasts
    # seconds, long enough to lose a node in the middle however fast the machine is
    proc = subprocess.Popen(
        lab_argv("sweep", "--conc", str(CONC), "--requests", str(REQUESTS), "--isl", "16",
                 "--osl", "32", "--speedup", "1", "--no-plots", "--out", str(run),
                 *ray_args(ray_cluster)),
        stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    lines: list[str] = []
    removed = None
    try:
        placed = {}
        for _ in range(3):
            m = wait_line(proc, r"ray client actor (\d+): node (\w+)", lines, 90)
            placed[int(m.group(1))] = m.group(2)
        url = wait_line(proc, r"stack ready: (\S+)", lines, 90).group(1)
        head = ray_cluster.cluster.head_node.node_id
        victim = next(k for k, node in placed.items() if not head.startswith(node))
        deadline = time.monotonic() + 60
        while finished(url) < CONC * 3:  # the level is under way
            assert time.monotonic() < deadline, "the level did not start"
            time.sleep(0.05)
        removed = ray_cluster.remove(placed[victim])
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if removed is not None:
            ray_cluster.add(removed)
            ray_cluster.cluster.wait_for_nodes()
    err = "".join(lines) + stderr
    req = read_requests(run)
    # every planned request has a record: the lost ones counted, with the reason
    assert len(req) == CONC + REQUESTS, err
    lost = req[req["error_kind"] == LOST_KIND]
    assert len(lost) > 0, err
    assert (lost["client_proc"] == victim).all()
    assert lost["error_message"].str.contains(f"client actor {victim} on node").all()
    assert lost["error_message"].str.contains("lost").all()
    # the others finished, and the level reported
    assert req.loc[req["error_kind"] != LOST_KIND, "ok"].all()
    assert (run / "levels.csv").exists()
    assert f"lost: client actor {victim} on node" in (run / "report.md").read_text()
    assert "c=6" in stdout + err


@pytest.fixture(autouse=True)
def _three_nodes(ray_cluster: RayCluster) -> None:
    assert len(ray_cluster.nodes) == 3
