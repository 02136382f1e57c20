"""The rendered manifests' commands serve: every container started exactly as its manifest
says (tests/k8s/pod_runner.py states the only substitutions: downward API, loopback ports,
Service names, emptyDir paths), every readiness and liveness probe passes on the port it
names, and `lab sweep --target` through the frontend's Service gets no errors.

etcd discovery as rendered (Debian's etcd-server on PATH runs the StatefulSet's command)."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from lab.commands.merge import merge
from lab.commands.sweep import sweep
from launch.k8s.options import FRONTEND_PORT, RenderOptions
from launch.k8s.render import read, render, write
from launch.topology import TopologySpec
from tests.k8s.pod_runner import Cluster
from tests.procs import Proc, stop_all

pytestmark = pytest.mark.skipif(shutil.which("etcd") is None,
                                reason="needs etcd on PATH (apt-get install -y etcd-server)")
REQUESTS = 6


def sweep_through(url: str, out: Path, *extra: str) -> pd.DataFrame:
    # the load client in this process: it is the test's instrument, not one of the manifests'
    # commands (a client process per level costs ~1 s of imports each)
    result = CliRunner().invoke(sweep, [*extra,
        "--target", url, "--isl", "16", "--osl", "8", "--conc", "1,3",
        "--requests", str(REQUESTS), "--warmup", "1", "--timeout", "30", "--quiet",
        "--no-plots", "--in-process-client", "--out", str(out)])
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


@pytest.mark.timeout(300)
def test_client_job_shards_meet_and_merge(spawn: Callable[..., Proc], tmp_path: Path) -> None:
    """The Indexed Job's 2 pods wait for the frontend, meet at the etcd barrier, each sweep
    their half of every level, and `lab merge` makes one run of them with 0 errors."""
    spec = TopologySpec.aggregated(engines=1, name="agg", grace_s=2)
    opts = RenderOptions(client_shards=2, client_conc="2,4", client_args=(
        "--isl", "16", "--osl", "8", "--requests", "8", "--warmup", "1", "--timeout", "30"))
    cluster = Cluster(render(spec, opts), tmp_path / "pods")
    cluster.start(spawn)
    cluster.wait_ready()
    clients = [p for pod in cluster.pods if pod.kind == "Job" for p in pod.main_procs()]
    assert len(clients) == 2
    deadline = time.monotonic() + 240
    while any(p.popen.poll() is None for p in clients):  # a failed shard fails the test at once
        failed = [p for p in clients if p.popen.poll() not in (None, 0)]
        assert not failed, failed[0].log()[-3000:]
        assert time.monotonic() < deadline, "the client shards did not finish in time"
        time.sleep(0.2)
    assert [p.popen.returncode for p in clients] == [0, 0], [p.log()[-2000:] for p in clients]
    (uid_dir,) = (tmp_path / "pods" / "claims" / "agg-client-results").iterdir()
    shards = sorted(uid_dir.glob("shard-*"))
    assert [s.name for s in shards] == ["shard-0", "shard-1"]
    infos = [json.loads((s / "shard.json").read_text()) for s in shards]
    # one agreed start for both, each ran half of every level
    assert infos[0]["barrier"]["start_wall_ns"] == infos[1]["barrier"]["start_wall_ns"]
    assert all(i["levels"] == {"1": 2, "2": 4} for i in infos)
    for s in shards:
        assert set(pd.read_parquet(s / "requests.parquet")["concurrency"]) == {1, 2}
    out = tmp_path / "merged"
    result = CliRunner().invoke(merge, [*map(str, shards), "--out", str(out), "--no-plots"])
    assert result.exit_code == 0, result.output
    req = pd.read_parquet(out / "requests.parquet")
    req = req[~req["warmup"]]
    assert sorted(set(req["concurrency"])) == [2, 4]
    assert len(req) == 2 * 2 * 4  # 2 levels x 2 shards x ceil(8 / 2) requests
    errors = req.loc[~req["ok"], ["error_kind", "error_message"]]
    assert errors.empty, errors.to_string()
    # on one clock: every request's stamps lie after the agreed start
    assert (req["sent_ns"] >= infos[0]["barrier"]["start_wall_ns"]).all()
    levels = json.loads((out / "levels.json").read_text())
    assert [lv["concurrency"] for lv in levels] == [2, 4]


@pytest.mark.timeout(300)
def test_dynamo_arrangement_serves_a_sweep(spawn: Callable[..., Proc], tmp_path: Path) -> None:
    """`--sidecar dynamo`: the mocker with Dynamo 1.6.1's TRT-LLM sidecar as its native sidecar
    and Dynamo's frontend, etcd discovery, started as rendered (the Dynamo image's python3 is
    the Dynamo venv's; the image's model dir is one the test builds)."""
    from tests.interop import dynamo_stack as dyn
    from tests.interop.model_dir import build_model_dir

    reason = dyn.unusable_reason()
    if reason:
        pytest.skip(reason)
    opts = RenderOptions(sidecar="dynamo")
    model = tmp_path / "model"
    build_model_dir(model)
    spec = TopologySpec.aggregated(engines=1, name="dyn", grace_s=2)
    cluster = Cluster(render(spec, opts), tmp_path / "pods",
                      interpreters={opts.dynamo_image: str(dyn.python())},
                      paths={opts.model_path: model})
    cluster.start(spawn)
    cluster.wait_ready()
    url = cluster.service_url("dyn-frontend", FRONTEND_PORT)
    frontend = next(p for pod in cluster.pods for p in pod.main_procs()
                    if pod.name == "dyn-frontend-0")
    # Dynamo's /health answers before a model is registered: wait as the interop tests do
    dyn.wait_until(lambda: str(model) in dyn.served_models(url), "the model in /v1/models",
                   lambda: None if frontend.popen.poll() is None else frontend.log()[-2000:],
                   timeout_s=90)
    req = sweep_through(url, tmp_path / "run", "--model", str(model), "--tokenizer", str(model),
                        "--endpoint", "completions")
    errors = req.loc[~req["ok"], ["error_kind", "error_message"]]
    assert errors.empty, errors.to_string()
    assert len(req) == 2 * REQUESTS
    # Dynamo's sidecar takes ~5 s to exit on SIGTERM, and `spawn` stops one process after
    # another. How Dynamo exits is not what this test checks: SIGTERM every process at once,
    # then give each 2 s (as tests/interop/test_dynamo_sidecar.py does).
    stop_all((proc for pod in cluster.pods for _, proc in pod.procs), timeout=2)
