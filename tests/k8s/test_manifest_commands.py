"""The rendered manifests' commands serve: every container started exactly as its manifest
says (tests/k8s/pod_runner.py states the only substitutions: downward API, loopback ports,
Service names, emptyDir paths), every readiness and liveness probe passes on the port it
names, and `lab sweep --target` through the frontend's Service gets no errors.

etcd discovery as rendered (Debian's etcd-server on PATH runs the StatefulSet's command)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from lab.commands.sweep import sweep
from launch.k8s.options import FRONTEND_PORT, RenderOptions
from launch.k8s.render import read, render, write
from launch.topology import TopologySpec
from tests.k8s.pod_runner import Cluster
from tests.procs import Proc

pytestmark = pytest.mark.skipif(shutil.which("etcd") is None,
                                reason="needs etcd on PATH (apt-get install -y etcd-server)")
REQUESTS = 6


def sweep_through(url: str, out: Path) -> pd.DataFrame:
    result = CliRunner().invoke(sweep, [
        "--target", url, "--isl", "16", "--osl", "8", "--conc", "1,3",
        "--requests", str(REQUESTS), "--warmup", "1", "--timeout", "30", "--quiet",
        "--no-plots", "--out", str(out)])
    assert "Traceback" not in result.output, result.output
    assert result.exit_code == 0, result.output
    req = pd.read_parquet(out / "requests.parquet")
    return req[~req["warmup"]]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("spec", [
    TopologySpec.aggregated(engines=2, name="agg", grace_s=2),
    TopologySpec.disaggregated(prefill=1, decode=2, name="pd", grace_s=2),
], ids=["agg", "disagg"])
def test_rendered_commands_serve_a_sweep(spec: TopologySpec, spawn: Callable[..., Proc],
                                         tmp_path: Path) -> None:
    write(render(spec, RenderOptions()), tmp_path / "manifests")
    cluster = Cluster(read(tmp_path / "manifests"), tmp_path / "pods")
    cluster.start(spawn)
    assert len(cluster.pods) == 1 + sum(f.count for f in spec.fleets) + 1  # etcd, workers, fe
    cluster.wait_ready()
    req = sweep_through(cluster.service_url(f"{spec.name}-frontend", FRONTEND_PORT),
                        tmp_path / "run")
    assert len(req) == 2 * REQUESTS
    errors = req.loc[~req["ok"], ["error_kind", "error_message"]]
    assert errors.empty, errors.to_string()
    assert (req["output_tokens"] == 8).all(), req["output_tokens"].tolist()
