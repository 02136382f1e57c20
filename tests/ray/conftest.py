"""One real multi-node Ray cluster for the Ray tests (`ray.cluster_utils.Cluster`): a head and two
workers on this machine, one CPU each, each with its own custom resource (`node0`..`node2`), its
own label (`lab-node` = "0".."2") and one unit of `lab_client` (the workers also `lab_pair`),
so a STRICT_SPREAD client puts one actor on each. Torn down at the end of the session, also
when the run is interrupted (pytest runs fixture finalizers on Ctrl-C)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="the Ray tests need the ray extra: pip install '.[ray]'")

from ray.cluster_utils import Cluster  # noqa: E402

NODES = 3
CLIENT_RESOURCE = "lab_client"


#: Each node's label (`ray start --labels`): lab-node = "<k>".
NODE_LABEL = "lab-node"


#: A custom resource the two workers (nodes 1 and 2) have: a fleet placed by it spreads over them.
PAIR_RESOURCE = "lab_pair"


def node_args(k: int) -> dict[str, Any]:
    pair = {PAIR_RESOURCE: 1} if k > 0 else {}
    return {"num_cpus": 1, "resources": {f"node{k}": 1, CLIENT_RESOURCE: 1, **pair},
            "labels": {NODE_LABEL: str(k)},
            "include_dashboard": False, "object_store_memory": 80 * 1024 * 1024}


@dataclass
class RayCluster:
    cluster: Cluster
    nodes: dict[str, tuple[int, Any]] = field(default_factory=dict)  # node id -> (k, node)

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def add(self, k: int) -> Any:
        node = self.cluster.add_node(**node_args(k))
        self.nodes[node.node_id] = (k, node)
        return node

    def remove(self, node_id_prefix: str) -> int:
        """Remove (kill) the worker node whose id starts with the prefix; its index."""
        for node_id, (k, node) in list(self.nodes.items()):
            if node_id.startswith(node_id_prefix) and node is not self.cluster.head_node:
                self.cluster.remove_node(node, allow_graceful=False)
                del self.nodes[node_id]
                return k
        raise AssertionError(f"no worker node {node_id_prefix} in {list(self.nodes)}")


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    cluster = Cluster(initialize_head=True, connect=False, head_node_args=node_args(0))
    rc = RayCluster(cluster, {cluster.head_node.node_id: (0, cluster.head_node)})
    try:
        for k in range(1, NODES):
            rc.add(k)
        cluster.wait_for_nodes()
        yield rc
    finally:
        cluster.shutdown()
