"""`lab render k8s --sidecar dynamo --dynamo-operator`: one DynamoGraphDeployment, valid
against Dynamo's CRD schema (launch/k8s/crd/, vendored from ai-dynamo/dynamo) in strict mode,
its pod templates against the Kubernetes schemas of 1.30 to 1.34, shaped as Dynamo's TRT-LLM
deploy examples (a frontend component; per fleet a component of the fleet's type whose `main`
container is the TRT-LLM sidecar beside the mocker engine)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from click.testing import CliRunner

from lab.cli import main
from launch.k8s.crd import DGD_API_VERSION, DGD_KIND, dgd_problems
from launch.k8s.options import RenderOptions
from launch.k8s.render import read, render
from launch.k8s.validate import DEFAULT_VERSIONS, problems
from tests.k8s.topologies import aggregated, disaggregated

pytest.importorskip("kubernetes_validate")
OPERATOR = RenderOptions(sidecar="dynamo", dynamo_operator=True)


def the_dgd(objects: list[dict]) -> dict:
    (dgd,) = [o for o in objects if o["kind"] == DGD_KIND]
    return dgd


@pytest.mark.parametrize(("spec", "components"), [
    (aggregated(), {"Frontend": ("frontend", 1), "Worker": ("worker", 2)}),
    (disaggregated(), {"Frontend": ("frontend", 1), "PrefillWorker": ("prefill", 2),
                       "DecodeWorker": ("decode", 4)}),
], ids=["agg", "2p4d"])
def test_the_dgd_is_valid_and_shaped_as_dynamos_examples(spec, components: dict) -> None:
    objects = render(spec, OPERATOR)
    assert [o["kind"] for o in objects] == [DGD_KIND]  # the operator makes the rest
    assert problems(objects, DEFAULT_VERSIONS) == []
    dgd = the_dgd(objects)
    assert dgd["apiVersion"] == DGD_API_VERSION == "nvidia.com/v1beta1"
    assert dgd["spec"]["backendFramework"] == "trtllm"
    assert {c["name"]: (c["type"], c["replicas"]) for c in dgd["spec"]["components"]} == \
        components
    for c in dgd["spec"]["components"]:
        containers = {x["name"]: x for x in c["podTemplate"]["spec"]["containers"]}
        main_args = containers["main"]["args"]
        if c["type"] == "frontend":
            assert list(containers) == ["main"]
            assert main_args[:2] == ["-m", "dynamo.frontend"]
            continue
        # the sidecar is `main` (the operator's defaults go there), the engine beside it
        assert list(containers) == ["main", "engine"]
        assert main_args[:2] == ["-m", "dynamo.trtllm.sidecar"]
        assert main_args[main_args.index("--grpc-endpoint") + 1] == "127.0.0.1:50051"
        assert "--discovery-backend" not in main_args  # the operator's platform decides
        if c["type"] != "worker":
            assert main_args[main_args.index("--disaggregation-mode") + 1] == c["type"]
        engine = containers["engine"]
        assert engine["command"] == ["mocker"] and engine["args"][0] == "serve"
        assert engine["readinessProbe"]["grpc"] == {"port": 50051, "service": "inference"}


def test_a_misspelt_field_is_caught() -> None:
    """Validation can fail: a misspelt component field, a wrong component type, a misspelt
    spec field (the CRD's own schema), and a misspelt container field (the pod template)."""
    dgd = the_dgd(render(disaggregated(), OPERATOR))
    cases = {}
    for what in ("replica", "type", "backendFrameworks", "readinesProbe"):
        d = copy.deepcopy(dgd)
        c = d["spec"]["components"][1]
        if what == "replica":
            c["replica"] = c.pop("replicas")
        elif what == "type":
            c["type"] = "aggregated"
        elif what == "backendFrameworks":
            d["spec"]["backendFrameworks"] = d["spec"].pop("backendFramework")
        else:
            engine = c["podTemplate"]["spec"]["containers"][1]
            engine["readinesProbe"] = engine.pop("readinessProbe")
        cases[what] = dgd_problems(d, ("1.30",))
    assert "'replica' was unexpected" in " ".join(cases["replica"]), cases
    assert "spec.components.1.type: 'aggregated' is not one of" in " ".join(cases["type"])
    assert "'backendFrameworks' was unexpected" in " ".join(cases["backendFrameworks"])
    assert any("spec.components.1.podTemplate.spec.containers.1" in p
               and "'readinesProbe' was unexpected" in p for p in cases["readinesProbe"]), cases


def test_the_client_job_targets_the_operators_frontend(tmp_path: Path) -> None:
    out = tmp_path / "m"
    result = CliRunner().invoke(main, [
        "render", "k8s", "--prefill", "2", "--decode", "4", "--name", "pd", "--sidecar",
        "dynamo", "--dynamo-operator", "--client-shards", "3", "--client-rate", "30,60",
        "--validate", "1.30,1.34", "--out", str(out)])
    assert result.exit_code == 0, result.output
    objects = read(out)
    assert [o["kind"] for o in objects] == [DGD_KIND, "Service", "StatefulSet",
                                            "PersistentVolumeClaim", "Job"]
    (job,) = [o for o in objects if o["kind"] == "Job"]
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--target") + 1] == "http://pd-frontend:8000"
    assert args[args.index("--rate") + 1] == "30,60" and "--conc" not in args
    assert args[args.index("--barrier") + 1] == "etcd://pd-etcd:2379/$(JOB_UID)"


def test_dynamo_operator_needs_the_dynamo_sidecar(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["render", "k8s", "--dynamo-operator", "--out",
                                       str(tmp_path / "o")])
    assert result.exit_code == 2 and "--sidecar dynamo" in result.output, result.output
    assert not (tmp_path / "o").exists()
