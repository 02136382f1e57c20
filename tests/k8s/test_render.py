"""`lab render k8s`: the objects of agg and 2P+4D topologies are valid Kubernetes objects of
every version users run (the schemas of kubernetes-validate, strict), and arranged as the
issue asks: per engine a pod with the sidecar as a native sidecar, probes on the ports the
containers declare, the frontend behind a Service, etcd discovery."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from lab.cli import main
from launch.k8s.options import RenderOptions
from launch.k8s.render import read, render
from launch.k8s.validate import DEFAULT_VERSIONS, problems
from tests.k8s.topologies import aggregated, disaggregated

pytest.importorskip("kubernetes_validate")


def by_kind(objects: list[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


@pytest.mark.parametrize("sidecar", ["lab", "dynamo"])
@pytest.mark.parametrize("spec", [aggregated(), disaggregated()], ids=["agg", "2p4d"])
def test_every_object_is_valid_on_every_supported_version(spec, sidecar: str) -> None:
    objects = render(spec, RenderOptions(sidecar=sidecar, client_shards=4))
    assert {"Job", "PersistentVolumeClaim", "StatefulSet", "Deployment", "Service"} == {
        o["kind"] for o in objects}
    assert problems(objects, DEFAULT_VERSIONS) == []
    assert DEFAULT_VERSIONS == ("1.30", "1.31", "1.32", "1.33", "1.34")


def test_the_validator_refuses_a_broken_object() -> None:
    """A misspelt probe field and a missing selector fail: validation can fail."""
    objects = render(aggregated(), RenderOptions())
    deploy = by_kind(objects, "Deployment")["agg-aggregated"]
    probe = deploy["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    probe["grcp"] = probe.pop("grpc")
    del by_kind(objects, "Deployment")["agg-frontend"]["spec"]["selector"]
    found = problems(objects, ("1.30",))
    assert any("Deployment/agg-aggregated" in p and "grcp" in p for p in found), found
    assert any("Deployment/agg-frontend" in p and "selector" in p for p in found), found


def test_workers_are_pods_of_engine_and_native_sidecar() -> None:
    spec = disaggregated()
    objects = render(spec, RenderOptions())
    deploys = by_kind(objects, "Deployment")
    assert {n: d["spec"]["replicas"] for n, d in deploys.items()} == {
        "pd-prefill": 2, "pd-decode": 4, "pd-frontend": 1}
    for name in ("pd-prefill", "pd-decode"):
        pod = deploys[name]["spec"]["template"]["spec"]
        (engine,) = pod["containers"]
        (sidecar,) = pod["initContainers"]
        assert sidecar["restartPolicy"] == "Always"
        assert engine["command"] == ["mocker"] and engine["args"][0] == "serve"
        assert sidecar["command"] == ["lab"] and sidecar["args"][0] == "sidecar"
        role = name.removeprefix("pd-")
        assert engine["args"][engine["args"].index("--role") + 1] == role
        ports = {p["containerPort"] for p in engine["ports"]}
        assert engine["readinessProbe"]["grpc"] == {"port": 50051, "service": "inference"}
        assert engine["livenessProbe"]["grpc"] == {"port": 50051, "service": "liveness"}
        assert {engine["readinessProbe"]["grpc"]["port"]} <= ports
        # the sidecar reaches its engine inside the pod and advertises the pod's address
        assert sidecar["args"][sidecar["args"].index("--engine") + 1] == "127.0.0.1:50051"
        assert sidecar["args"][sidecar["args"].index("--listen") + 1] == "$(POD_IP):0"
        assert sidecar["args"][sidecar["args"].index("--discovery") + 1] == \
            "etcd://pd-etcd:2379"
        assert "memory" in engine["resources"]["limits"]


def test_frontend_service_probes_and_etcd() -> None:
    objects = render(disaggregated(), RenderOptions())
    (fe,) = by_kind(objects, "Deployment")["pd-frontend"]["spec"]["template"]["spec"][
        "containers"]
    assert fe["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    assert fe["livenessProbe"]["httpGet"] == {"path": "/live", "port": 8000}
    args = fe["args"]
    assert args[args.index("--listen") + 1] == "0.0.0.0:8000"
    assert args[args.index("--discovery") + 1] == "etcd://pd-etcd:2379"
    services = by_kind(objects, "Service")
    assert services["pd-frontend"]["spec"]["ports"][0]["port"] == 8000
    assert services["pd-frontend"]["spec"]["selector"] == \
        by_kind(objects, "Deployment")["pd-frontend"]["spec"]["selector"]["matchLabels"]
    assert "pd-etcd" in by_kind(objects, "StatefulSet")


def test_a_users_etcd_replaces_the_statefulset() -> None:
    objects = render(aggregated(), RenderOptions(etcd="etcd.infra:2379", namespace="bench"))
    assert not by_kind(objects, "StatefulSet")
    assert all(o["metadata"]["namespace"] == "bench" for o in objects)
    (fe,) = by_kind(objects, "Deployment")["agg-frontend"]["spec"]["template"]["spec"][
        "containers"]
    assert "etcd://etcd.infra:2379" in fe["args"]
    assert problems(objects, ("1.34",)) == []


def test_cli_writes_validated_manifests(tmp_path: Path) -> None:
    topo = tmp_path / "pd.toml"
    topo.write_text('name = "pd"\n[[fleet]]\nrole = "prefill"\ncount = 2\n'
                    '[[fleet]]\nrole = "decode"\ncount = 4\n')
    out = tmp_path / "manifests"
    result = CliRunner().invoke(main, ["render", "k8s", str(topo), "--out", str(out),
                                       "--validate", "1.30,1.34",
                                       "--resources", "engine=2,4Gi"])
    assert result.exit_code == 0, result.output
    objects = read(out)
    assert [o["kind"] for o in objects] == ["Service", "StatefulSet", "Deployment",
                                            "Deployment", "Deployment", "Service"]
    engine = by_kind(objects, "Deployment")["pd-decode"]["spec"]["template"]["spec"][
        "containers"][0]
    assert engine["resources"]["requests"] == {"cpu": "2", "memory": "4Gi"}
    # flags work too, and a second render into the same directory replaces the first
    result = CliRunner().invoke(main, ["render", "k8s", "--engines", "3", "--name", "agg",
                                       "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert {o["metadata"]["name"] for o in read(out)} == {
        "agg-etcd", "agg-aggregated", "agg-frontend"}


@pytest.mark.parametrize(("args", "named"), [
    (["--resources", "gpu=1,1Gi"], "--resources"),
    (["--namespace", "Bad_NS"], "--namespace"),
    (["--etcd", "nohost"], "--etcd"),
    (["--validate", "latest"], "--validate"),
    (["--name", "x" * 40], "name"),
    (["/nonexistent.toml"], "--topology"),
    (["--client-shards", "2", "--client-conc", "3"], "--client-conc"),
    (["--client-conc", "4"], "--client-shards"),
    (["--client-shards", "2", "--client-args", "'unclosed"], "--client-args"),
    (["--client-rate", "10"], "--client-shards"),
    (["--client-shards", "2", "--client-rate", "0"], "--client-rate"),
    (["--client-shards", "2", "--client-rate", "auto"], "--client-rate"),
    (["--client-shards", "2", "--client-rate", "10", "--client-conc", "4"], "--client-rate"),
])
def test_bad_input_is_one_line_naming_it(tmp_path: Path, args: list[str], named: str) -> None:
    result = CliRunner().invoke(main, ["render", "k8s", "--out", str(tmp_path / "o"), *args])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert named in result.output, result.output
    assert not (tmp_path / "o").exists()


def test_dynamo_arrangement() -> None:
    objects = render(disaggregated(), RenderOptions(sidecar="dynamo"))
    pod = by_kind(objects, "Deployment")["pd-prefill"]["spec"]["template"]["spec"]
    (engine,) = pod["containers"]
    (sidecar,) = pod["initContainers"]
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["args"][:2] == ["-m", "dynamo.trtllm.sidecar"]
    assert sidecar["args"][sidecar["args"].index("--disaggregation-mode") + 1] == "prefill"
    assert sidecar["args"][sidecar["args"].index("--grpc-endpoint") + 1] == "127.0.0.1:50051"
    env = {e["name"]: e.get("value") for e in sidecar["env"]}
    assert env["ETCD_ENDPOINTS"] == "http://pd-etcd:2379"
    assert env["DYN_TCP_RPC_HOST"] == "$(POD_IP)"
    # the engine emits the model dir's vocabulary, as in the interop tests
    assert engine["args"][engine["args"].index("--tokenizer") + 1] == "/models/lab"
    (fe,) = by_kind(objects, "Deployment")["pd-frontend"]["spec"]["template"]["spec"][
        "containers"]
    assert fe["args"][:2] == ["-m", "dynamo.frontend"]


def test_client_job_is_indexed_and_sharded() -> None:
    objects = render(aggregated(), RenderOptions(client_shards=3))
    job = by_kind(objects, "Job")["agg-client"]
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 3
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--shard") + 1] == "$(JOB_COMPLETION_INDEX)/3"
    assert args[args.index("--conc") + 1] == "3,24,96"
    assert args[args.index("--target") + 1] == "http://agg-frontend:8000"
    assert args[args.index("--barrier") + 1] == "etcd://agg-etcd:2379/$(JOB_UID)"


def test_client_job_with_rates_splits_streams() -> None:
    objects = render(aggregated(), RenderOptions(client_shards=3, client_rate="30,90"))
    args = by_kind(objects, "Job")["agg-client"]["spec"]["template"]["spec"]["containers"][0][
        "args"]
    assert args[args.index("--rate") + 1] == "30,90" and "--conc" not in args
    assert args[args.index("--shard") + 1] == "$(JOB_COMPLETION_INDEX)/3"
    assert problems(objects, ("1.34",)) == []
