"""`lab sweep --ray`: the load client's processes as Ray actors over the 3-node cluster
(tests/ray/conftest.py), against the stack the sweep launches: the concurrency split exactly,
one merged run directory with the same requests.parquet schema and report as a local run, the
clock offsets stated; and a node lost mid-level, its requests counted as lost with the reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from lab.analysis.rundir import read_requests
from tests.ray.conftest import CLIENT_RESOURCE, NODES, RayCluster

CONC = 5  # over 3 actors: 2 + 2 + 1 slots
REQUESTS = 25
SHORT = ["--isl", "16", "--osl", "8", "--no-plots", "--quiet"]


def lab_argv(*args: str) -> list[str]:
    return [str(Path(sys.executable).parent / "lab"), *args]


def lab(*args: str, timeout: float = 150) -> subprocess.CompletedProcess:
    return subprocess.run(lab_argv(*args), capture_output=True, text=True, timeout=timeout)


def ray_args(cluster: RayCluster) -> list[str]:
    return ["--ray", cluster.address, "--ray-client-nodes", str(NODES),
            "--ray-spread", "strict-spread", "--ray-client-resource", CLIENT_RESOURCE]


def peak_in_flight(req: pd.DataFrame) -> int:
    """The most requests in flight at once, from the sent/done stamps."""
    events = sorted([(t, 1) for t in req["sent_ns"]] + [(t, -1) for t in req["done_ns"]],
                    key=lambda e: (e[0], e[1]))
    now = peak = 0
    for _, d in events:
        now += d
        peak = max(peak, now)
    return peak


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("local") / "run"
    out = lab("sweep", "--conc", str(CONC), "--requests", str(REQUESTS), *SHORT, "--out",
              str(run))
    assert out.returncode == 0, out.stderr
    return run


def test_client_split_over_three_nodes(ray_cluster: RayCluster, local_run: Path,
                                       tmp_path: Path) -> None:
    run = tmp_path / "run"
    out = lab("sweep", "--conc", str(CONC), "--requests", str(REQUESTS), *SHORT, "--out",
              str(run), *ray_args(ray_cluster))
    assert out.returncode == 0, out.stderr
    req = read_requests(run)
    local = read_requests(local_run)
    # the same requests as a local run: count, ids, all ok
    assert len(req) == len(local) == CONC + REQUESTS
    assert sorted(req["request_id"]) == sorted(local["request_id"])
    assert req["ok"].all(), req.loc[~req["ok"], ["error_kind", "error_message"]]
    # one actor per node, the concurrency split exactly: 2 + 2 + 1 slots, each busy at once
    health = json.loads((run / "client.json").read_text())
    level = next(iter(health.values()))
    assert level["procs"] == NODES and len(set(level["nodes"])) == NODES
    shares = {k: peak_in_flight(g) for k, g in req.groupby("client_proc")}
    assert shares == {0: 2, 1: 2, 2: 1}
    assert peak_in_flight(req) <= CONC
    # requests in proportion to the slots
    assert req.groupby("client_proc").size().to_dict() == {0: 12, 1: 12, 2: 6}
    # the clock offsets and their error bound are stated
    assert len(level["clock_offsets_ns"]) == NODES
    assert 0 < level["clock_error_ns_max"] < 1e9
    # ... in the report too
    report = (run / "report.md").read_text()
    assert "client on Ray, level 5/0" in report and "3 actors on 3 nodes" in report, report
    assert "clock offsets" in report and "error bound <=" in report
    # the same schema and report as a local run
    stored = pd.read_parquet(run / "requests.parquet")
    stored_local = pd.read_parquet(local_run / "requests.parquet")
    assert dict(stored.dtypes) == dict(stored_local.dtypes)
    # (the per-process server CPU columns follow the launcher's samples, which a short level
    # may or may not have for each process: not the client's doing)
    def client_columns(levels: pd.DataFrame) -> list[str]:
        return [c for c in levels.columns if ":" not in c and not c.startswith("server_")]

    assert (client_columns(pd.read_csv(run / "levels.csv"))
            == client_columns(pd.read_csv(local_run / "levels.csv")))
    heads = [line for line in (run / "report.md").read_text().splitlines()
             if line.startswith("#")]
    assert heads == [line for line in (local_run / "report.md").read_text().splitlines()
                     if line.startswith("#")]
