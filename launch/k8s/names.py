"""Object names and labels of one rendered topology (one prefix, DNS-1123 names)."""

from __future__ import annotations

from dataclasses import dataclass

from launch.k8s.options import object_prefix
from launch.topology import TopologySpec

PART_OF = "loadlab"


@dataclass(frozen=True)
class Names:
    prefix: str

    @classmethod
    def of(cls, spec: TopologySpec) -> Names:
        return cls(object_prefix(spec.name))

    def labels(self, component: str, role: str | None = None) -> dict[str, str]:
        out = {"app.kubernetes.io/part-of": PART_OF, "app.kubernetes.io/instance": self.prefix,
               "app.kubernetes.io/component": component}
        if role is not None:
            out["loadlab/role"] = role
        return out

    @property
    def frontend(self) -> str:
        return f"{self.prefix}-frontend"

    @property
    def etcd(self) -> str:
        return f"{self.prefix}-etcd"

    @property
    def client(self) -> str:
        return f"{self.prefix}-client"

    def worker(self, spec: TopologySpec, index: int) -> tuple[str, dict[str, str]]:
        """`<prefix>-<role>` for a fleet, `-<k>` added when several fleets share a role."""
        fleet = spec.fleets[index]
        same = [i for i, f in enumerate(spec.fleets) if f.role == fleet.role]
        suffix = f"-{same.index(index)}" if len(same) > 1 else ""
        name = f"{self.prefix}-{fleet.role}{suffix}"
        labels = self.labels("worker", fleet.role)
        labels["loadlab/fleet"] = name
        return name, labels
