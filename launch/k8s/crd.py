"""Offline validation of a DynamoGraphDeployment against Dynamo's CRD schema (vendored).

`crd/nvidia.com_dynamographdeployments.v1beta1.yaml` is the `v1beta1` openAPIV3Schema of
ai-dynamo/dynamo's CRD (its header says which commit and what was trimmed). It is checked with
`jsonschema` the way the apiserver treats a structural schema with strict field validation
(`kubectl apply`'s default): an object schema with `properties` and neither
`additionalProperties` nor `x-kubernetes-preserve-unknown-fields: true` refuses any other field
(the apiserver would reject or prune it), so a misspelt field is an error here. The CEL rules
(`x-kubernetes-validations`) are not evaluated.

Each component's `podTemplate` (in the CRD, Kubernetes' own PodTemplateSpec inlined) and the
object's metadata are checked against the Kubernetes schemas of each version, by
`kubernetes-validate` (as a core/v1 PodTemplate of that metadata and template).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from launch.k8s.objects import Obj

DGD_KIND = "DynamoGraphDeployment"
DGD_API_VERSION = "nvidia.com/v1beta1"
SCHEMA_FILE = Path(__file__).with_name("crd") / "nvidia.com_dynamographdeployments.v1beta1.yaml"


def strict(schema: Any) -> Any:
    """The schema with `additionalProperties: false` wherever the apiserver refuses unknown
    fields (every object with `properties`, unless it preserves unknown fields)."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@functools.cache
def _schema() -> dict[str, Any]:
    import yaml

    loaded: dict[str, Any] = yaml.safe_load(SCHEMA_FILE.read_text())["openAPIV3Schema"]
    out: dict[str, Any] = strict(loaded)
    return out


def _where(path: Iterable[Any]) -> str:
    return ".".join(str(p) for p in path) or "<root>"


def dgd_problems(obj: Obj, versions: Iterable[str]) -> list[str]:
    """One line per problem of a DynamoGraphDeployment (empty: valid)."""
    import jsonschema

    name = f"{DGD_KIND}/{obj.get('metadata', {}).get('name')}"
    out: list[str] = []
    if obj.get("apiVersion") != DGD_API_VERSION:
        out.append(f"{name} (CRD): apiVersion: {obj.get('apiVersion')!r} is not "
                   f"{DGD_API_VERSION!r}, the version the vendored schema is")
    validator = jsonschema.Draft202012Validator(_schema())
    for err in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path)):
        out.append(f"{name} (CRD {DGD_API_VERSION}): {_where(err.absolute_path)}: {err.message}")
    components = obj.get("spec", {}).get("components") or []
    for version in versions:
        for i, component in enumerate(components if isinstance(components, list) else []):
            template = component.get("podTemplate") if isinstance(component, dict) else None
            if template is None:
                continue
            out += _pod_template_problems(obj, template, f"spec.components.{i}.podTemplate",
                                          f"{name} (k8s {version})", version)
    return out


def _pod_template_problems(obj: Obj, template: Obj, where: str, what: str,
                           version: str) -> list[str]:
    import kubernetes_validate
    from kubernetes_validate.utils import ValidationError

    wrapper = {"apiVersion": "v1", "kind": "PodTemplate",
               "metadata": copy.deepcopy(obj.get("metadata", {})), "template": template}
    try:
        kubernetes_validate.validate(wrapper, version, strict=True)
    except ValidationError as exc:
        path = list(exc.path)
        field = (_where([where, *path[1:]]) if path[:1] == ["template"] else _where(path))
        return [f"{what}: {field}: {exc.message}"]
    return []
