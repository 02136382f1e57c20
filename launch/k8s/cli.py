"""`lab render k8s`: write a topology's Kubernetes manifests (and validate them offline)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import click

from launch.cli_options import spec_from_options, topology_options
from launch.k8s.options import (
    DEFAULT_DYNAMO_IMAGE,
    DEFAULT_ETCD_IMAGE,
    DEFAULT_IMAGE,
    SIDECARS,
    RenderOptions,
    Resources,
    check_etcd,
    check_namespace,
)

_QUANTITY = re.compile(r"\d+(\.\d+)?(m|k|Ki|M|Mi|G|Gi|T|Ti)?")
_COMPONENTS = ("engine", "sidecar", "frontend", "client")
_RES_FIELD = {"engine": "engine", "sidecar": "sidecar_res", "frontend": "frontend",
              "client": "client"}


def _resources(values: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for value in values:
        component, sep, rest = value.partition("=")
        cpu, comma, memory = rest.partition(",")
        if (component not in _COMPONENTS or not sep or not comma
                or not _QUANTITY.fullmatch(cpu) or not _QUANTITY.fullmatch(memory)):
            raise click.BadParameter(
                f"{value!r}: expected COMPONENT=CPU,MEMORY with COMPONENT one of "
                f"{', '.join(_COMPONENTS)} (e.g. engine=2,4Gi)", param_hint="'--resources'")
        out[_RES_FIELD[component]] = Resources(cpu, memory)
    return out


def _checked(check: Any, value: str | None, option: str) -> str | None:
    if value is None:
        return None
    try:
        return str(check(value))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=f"'{option}'") from None


def _client_conc(value: str | None, shards: int) -> str | None:
    if value is None:
        return None
    if not shards:
        raise click.UsageError("--client-conc needs --client-shards")
    try:
        levels = [int(v) for v in value.split(",")]
    except ValueError:
        levels = []
    bad = [c for c in levels if c < 1 or c % shards]
    if not levels or bad:
        raise click.BadParameter(f"{value!r}: expected positive multiples of --client-shards "
                                 f"{shards}, comma-separated", param_hint="'--client-conc'")
    return ",".join(map(str, levels))


def _client_rate(value: str | None, shards: int, conc: str | None) -> str | None:
    if value is None:
        return None
    if not shards:
        raise click.UsageError("--client-rate needs --client-shards")
    if conc is not None:
        raise click.UsageError("--client-conc and --client-rate are alternatives (closed or "
                               "open loop)")
    from lab.shared.rates import parse_rates

    try:
        rates = parse_rates(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--client-rate'") from None
    return ",".join(f"{r:g}" for r in rates)


def _split_args(value: str) -> list[str]:
    import shlex

    try:
        return shlex.split(value)
    except ValueError as exc:
        raise click.BadParameter(f"{value!r}: {exc}", param_hint="'--client-args'") from None


@click.group()
def render() -> None:
    """Render a topology for another platform (Kubernetes)."""


@render.command("k8s")
@click.argument("topology_file", metavar="[TOPOLOGY]", required=False,
                type=click.Path(dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Directory for the manifests (one NN-kind-name.yaml per object; created if "
              "needed; manifests of an earlier render there are replaced).")
@click.option("--image", default=DEFAULT_IMAGE, show_default=True,
              help="Image with `lab` and `mocker` (built from launch/k8s/Dockerfile).")
@click.option("--namespace", default=None, help="metadata.namespace of every object.  "
              "[default: none, kubectl's current namespace]")
@click.option("--etcd", default=None, metavar="HOST:PORT",
              help="Use this etcd for discovery instead of rendering a one-member etcd "
              "StatefulSet.")
@click.option("--etcd-image", default=DEFAULT_ETCD_IMAGE, show_default=True)
@click.option("--sidecar", type=click.Choice(SIDECARS), default="lab", show_default=True,
              help="lab: the lab's sidecar and frontend; dynamo: Dynamo's TRT-LLM sidecar and "
              "frontend in front of the lab's mocker engines.")
@click.option("--dynamo-image", default=DEFAULT_DYNAMO_IMAGE, show_default=True,
              help="With --sidecar dynamo: the image with Dynamo 1.6.1 (launch/k8s/Dockerfile, "
              "--target dynamo).")
@click.option("--dynamo-operator", is_flag=True,
              help="With --sidecar dynamo: render one DynamoGraphDeployment (nvidia.com/v1beta1) "
              "for Dynamo's operator instead of Deployments, etcd and Services.")
@click.option("--model-path", default=RenderOptions.model_path, show_default=True,
              help="With --sidecar dynamo: the model directory inside the image "
              "(tokenizer.json, config.json) for Dynamo's --model-path and the mockers' "
              "--tokenizer.")
@click.option("--resources", "resources", multiple=True, metavar="COMPONENT=CPU,MEMORY",
              help="CPU request and memory request/limit of a container: engine, sidecar, "
              "frontend, client (repeatable).  [default: engine=1,1Gi sidecar=500m,512Mi "
              "frontend=1,1Gi client=1,1Gi]")
@click.option("--client-shards", type=click.IntRange(0, 1000), default=0, show_default=True,
              metavar="N", help="Render the load client as an Indexed Job of N pods (`lab sweep "
              "--target --shard I/N`, started together through an etcd barrier; `lab merge` "
              "joins their run directories). 0: no client.")
@click.option("--client-conc", default=None, metavar="LIST",
              help="The client's `--conc` levels, each a multiple of N.  [default: N,8N,32N]")
@click.option("--client-rate", default=None, metavar="LIST",
              help="The client's `--rate` levels (req/s) instead of --client-conc: each of the "
              "N pods sends its stream of every level's seeded schedule (N independent "
              "streams of rate/N).")
@click.option("--client-args", default="", metavar="ARGS",
              help="More `lab sweep` options for every shard, one shell-quoted string, e.g. "
              "\"--isl 512 --osl 128 --requests 2000\".")
@click.option("--results-claim", default=None, metavar="PVC",
              help="An existing PersistentVolumeClaim (ReadWriteMany) for the shards' run "
              "directories.  [default: render one, <name>-client-results, 1Gi]")
@click.option("--validate", "validate_versions", default=None, metavar="VERSIONS",
              help="Check every object against the Kubernetes schemas of these versions, "
              "e.g. 1.30,1.34 (needs the k8s extra); exit 1 naming each problem.")
@topology_options
def k8s(topology_file: Path | None, out: Path, image: str, namespace: str | None,
        etcd: str | None, etcd_image: str, sidecar: str, dynamo_image: str,
        dynamo_operator: bool, model_path: str,
        resources: tuple[str, ...], client_shards: int, client_conc: str | None,
        client_rate: str | None, client_args: str, results_claim: str | None,
        validate_versions: str | None,
        **kw: Any) -> None:
    """Write Kubernetes manifests of TOPOLOGY (a TOML file as `lab up --topology` takes, or the
    topology flags). Nothing is applied: `kubectl apply -f OUT`."""
    try:
        import yaml  # noqa: F401 - the manifests' format; the k8s extra installs it
    except ModuleNotFoundError:
        raise click.ClickException("lab render k8s writes YAML: install the k8s extra "
                                   "(pip install 'loadlab[k8s]')") from None
    if topology_file is not None:
        if kw.get("topology") is not None:
            raise click.UsageError("give the topology file once (TOPOLOGY or --topology)")
        kw["topology"] = topology_file
    spec = spec_from_options(**kw)
    if spec.hosts:
        click.echo("note: [hosts] (network namespaces, link shaping) are not rendered; the "
                   "cluster's network is used as it is", err=True)
    opts = RenderOptions(
        image=image, namespace=_checked(check_namespace, namespace, "--namespace"),
        etcd=_checked(check_etcd, etcd, "--etcd"), etcd_image=etcd_image, sidecar=sidecar,
        dynamo_image=dynamo_image, dynamo_operator=dynamo_operator, model_path=model_path)
    opts = dataclasses.replace(
        opts, **_resources(resources), client_shards=client_shards,
        client_conc=_client_conc(client_conc, client_shards),
        client_rate=_client_rate(client_rate, client_shards, client_conc),
        client_args=tuple(_split_args(client_args)), results_claim=results_claim)
    from launch.k8s.render import render as render_objects
    from launch.k8s.render import write

    try:
        objects = render_objects(spec, opts)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if validate_versions is not None:
        from launch.k8s.validate import ValidationFailed, parse_versions, problems

        try:
            versions = parse_versions(validate_versions)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="'--validate'") from None
        try:
            found = problems(objects, versions)
        except ValidationFailed as exc:
            raise click.ClickException(str(exc)) from None
        if found:
            for line in found:
                click.echo(line, err=True)
            raise click.ClickException(f"{len(found)} schema problem(s); nothing written")
    try:
        paths = write(objects, out)
    except OSError as exc:
        raise click.BadParameter(f"cannot write: {exc}", param_hint="'--out'") from None
    for path in paths:
        click.echo(str(path))
