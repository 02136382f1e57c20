"""Offline validation of rendered objects against the Kubernetes JSON schemas.

`kubernetes-validate` (pinned in the `k8s` and `test` extras) ships the schemas of every
Kubernetes minor from 1.25 to 1.37 in its 1.37.0 release; strict mode also refuses fields the
schema does not define (a misspelt field is an error, not silently dropped by the apiserver).
A DynamoGraphDeployment (`--dynamo-operator`) is checked against Dynamo's CRD schema instead
(`launch.k8s.crd`).
"""

from __future__ import annotations

from collections.abc import Iterable

from launch.k8s.objects import Obj

#: The Kubernetes versions users run, which `lab render k8s --validate` checks by default.
DEFAULT_VERSIONS = ("1.30", "1.31", "1.32", "1.33", "1.34")


class ValidationFailed(Exception):
    pass


def problems(objects: Iterable[Obj], versions: Iterable[str] = DEFAULT_VERSIONS) -> list[str]:
    """One line per object and version that fails (empty: all valid)."""
    try:
        import kubernetes_validate
        from kubernetes_validate.utils import (
            SchemaNotFoundError,
            ValidationError,
            VersionNotSupportedError,
        )
    except ModuleNotFoundError as exc:
        raise ValidationFailed(f"validation needs kubernetes-validate ({exc}); install the "
                               "k8s extra: pip install 'loadlab[k8s]'") from None
    from launch.k8s.crd import DGD_KIND, dgd_problems

    out: list[str] = []
    objects = list(objects)
    versions = list(versions)
    for obj in objects:
        if obj.get("kind") == DGD_KIND:  # Dynamo's custom resource: its CRD's schema
            out += dgd_problems(obj, versions)
    objects = [obj for obj in objects if obj.get("kind") != DGD_KIND]
    for version in versions:
        for obj in objects:
            what = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')} (k8s {version})"
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except ValidationError as exc:
                path = ".".join(str(p) for p in exc.path)
                out.append(f"{what}: {path or '<root>'}: {exc.message}")
            except (SchemaNotFoundError, VersionNotSupportedError) as exc:
                out.append(f"{what}: {exc}")
    return out


def parse_versions(text: str) -> tuple[str, ...]:
    versions = tuple(v.strip().removeprefix("v") for v in text.split(",") if v.strip())
    for v in versions:
        parts = v.split(".")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise ValueError(f"{v!r}: expected MAJOR.MINOR, e.g. 1.32")
    if not versions:
        raise ValueError("no version given")
    return versions
