"""A topology -> its Kubernetes objects -> one YAML file per object in a directory."""

from __future__ import annotations

from pathlib import Path

from launch.k8s import objects as k
from launch.k8s.names import Names
from launch.k8s.options import RenderOptions
from launch.topology import TopologySpec


def render(spec: TopologySpec, opts: RenderOptions) -> list[k.Obj]:
    """Every object of the stack; `opts.sidecar` picks the lab's or Dynamo's arrangement, and
    `opts.dynamo_operator` Dynamo's as one DynamoGraphDeployment."""
    names = Names.of(spec)
    if opts.dynamo_operator:
        if opts.sidecar != "dynamo":
            raise ValueError("--dynamo-operator renders Dynamo's arrangement: give --sidecar "
                             "dynamo")
        from launch.k8s.dgd import dgd_objects

        return dgd_objects(spec, opts, names)
    if opts.sidecar == "dynamo":
        from launch.k8s.dynamo_stack import dynamo_objects

        return dynamo_objects(spec, opts, names)
    from launch.k8s.lab_stack import lab_objects

    return lab_objects(spec, opts, names)


def file_name(obj: k.Obj, index: int) -> str:
    """`NN-kind-name.yaml`: `kubectl apply -f DIR` applies them in this (dependency) order."""
    return f"{index:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"


def to_yaml(obj: k.Obj) -> str:
    import yaml

    return str(yaml.safe_dump(obj, sort_keys=False, default_flow_style=False, width=100))


def write(objects: list[k.Obj], out: Path) -> list[Path]:
    """Write the objects into `out` (created if needed); files of an earlier render that this
    one does not write are removed, so the directory is exactly this stack."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / file_name(obj, i) for i, obj in enumerate(objects)]
    for old in out.glob("[0-9][0-9]-*.yaml"):
        if old not in paths:
            old.unlink()
    for obj, path in zip(objects, paths, strict=True):
        path.write_text(to_yaml(obj))
    return paths


def read(out: Path) -> list[k.Obj]:
    """The objects of a rendered directory, in file order."""
    import yaml

    return [yaml.safe_load(p.read_text()) for p in sorted(out.glob("[0-9][0-9]-*.yaml"))]
