"""Which live Ray node runs each process a topology places on Ray (`--ray`; docs/ray.md).

A place (a fleet's `ray_resource` / `ray_labels`, or the frontend's) is a selector: the nodes
that satisfy it are those whose total resources include that custom resource and whose labels
match every label (`value`, or Ray's label-selector forms `!value`, `in(a,b)`, `!in(a,b)`).
Each fleet's engines go round-robin over the nodes its selector matches (in the nodes' order:
address, then node id), each engine's sidecar with it; fleets whose selectors match the same
nodes continue one rotation, so two one-engine fleets on two such nodes get one node each; the
frontend takes the next turn of its selector's rotation. Then each node runs ONE agent with all
of that node's processes (launch.ray_fleet).

A place no live node satisfies is an error naming the fleet and the selector, raised before
anything starts. The nodes are read once, when the run starts: a node that joins later is not
used, one that leaves takes its agent with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from launch.topology import RayPlace, TopologySpec


class NoNodeError(ValueError):
    """A place of the topology that no live Ray node satisfies; the message names both."""

    def __init__(self, who: str, message: str) -> None:
        super().__init__(message)
        self.who = who


@dataclass(frozen=True)
class RayNode:
    """A live node of the cluster, as `ray.nodes()` describes it."""

    node_id: str
    address: str  # NodeManagerAddress: where the node's processes are reached
    resources: Mapping[str, float] = field(default_factory=dict, compare=False)
    labels: Mapping[str, str] = field(default_factory=dict, compare=False)

    @classmethod
    def from_ray(cls, info: Mapping[str, Any]) -> RayNode:
        return cls(str(info["NodeID"]), str(info["NodeManagerAddress"]),
                   dict(info.get("Resources") or {}), dict(info.get("Labels") or {}))

    def satisfies(self, place: RayPlace) -> bool:
        if place.resource is not None and self.resources.get(place.resource, 0) <= 0:
            return False
        return all(label_matches(self.labels.get(k), v) for k, v in place.labels)

    def describe(self) -> str:
        custom = sorted(k for k in self.resources
                        if k not in ("CPU", "GPU", "memory", "object_store_memory")
                        and not k.startswith("node:"))
        labels = sorted(f"{k}={v}" for k, v in self.labels.items()
                        if not k.startswith("ray.io/"))
        return (f"{self.node_id[:12]} at {self.address} (resources {', '.join(custom) or '-'}; "
                f"labels {', '.join(labels) or '-'})")


def label_matches(value: str | None, wanted: str) -> bool:
    """Ray's label-selector value forms: `v`, `!v`, `in(a,b)`, `!in(a,b)`."""
    negate = wanted.startswith("!")
    wanted = wanted[1:] if negate else wanted
    if wanted.startswith("in(") and wanted.endswith(")"):
        hit = value in {v.strip() for v in wanted[3:-1].split(",")}
    else:
        hit = value == wanted
    return hit != negate


def live_nodes() -> list[RayNode]:
    """The cluster's live nodes (the caller is connected), in placement order."""
    import ray

    nodes = [RayNode.from_ray(n) for n in ray.nodes() if n.get("Alive")]
    return sorted(nodes, key=lambda n: (n.address, n.node_id))


def assign(spec: TopologySpec, nodes: list[RayNode]) -> dict[str, RayNode]:
    """process name -> its node, for every process the topology places on Ray (see the module
    docstring); NoNodeError for a place no node satisfies, before any is assigned."""
    turns: dict[tuple[str, ...], int] = {}  # a set of matching nodes -> the next turn

    def matching(who: str, place: RayPlace) -> list[RayNode]:
        found = [n for n in nodes if n.satisfies(place)]
        if not found:
            raise NoNodeError(who, f"{who}: no live Ray node has {place.describe()} "
                              f"(`ray start --resources` / `--labels`); the nodes: "
                              + ("; ".join(n.describe() for n in nodes) or "none"))
        return found

    # every place resolved (and checked) once, before anything is assigned
    candidates: dict[int, list[RayNode]] = {}  # id(fleet) -> the nodes its place matches
    for index, fleet in enumerate(spec.fleets):
        place = RayPlace.of(fleet.ray_resource, fleet.ray_labels)
        if place is not None:
            candidates[id(fleet)] = matching(f"fleet {index} ({fleet.role})", place)
    frontend = RayPlace.of(spec.frontend_ray_resource, spec.frontend_ray_labels)
    frontend_nodes = matching("the frontend", frontend) if frontend is not None else None

    def next_turn(found: list[RayNode]) -> RayNode:
        key = tuple(n.node_id for n in found)
        turn = turns.get(key, 0)
        turns[key] = turn + 1
        return found[turn % len(found)]

    out: dict[str, RayNode] = {}
    for fleet, suffix in spec.workers():
        if id(fleet) in candidates:
            out[f"engine-{suffix}"] = out[f"sidecar-{suffix}"] = next_turn(candidates[id(fleet)])
    if frontend_nodes is not None:
        out["frontend"] = next_turn(frontend_nodes)
    return out


def by_node(assigned: Mapping[str, RayNode]) -> dict[RayNode, list[str]]:
    """node -> the names of its processes (in the order assigned)."""
    out: dict[RayNode, list[str]] = {}
    for name, node in assigned.items():
        out.setdefault(node, []).append(name)
    return out
