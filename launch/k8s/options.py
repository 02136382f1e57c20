"""What `lab render k8s` adds to a topology: images, namespace, ports, resources, discovery.

A topology says what runs (fleets, settings); these say where: the container image, the fixed
ports a Service and a probe need (a launched fleet binds port 0 instead), and the resources of
each container (a topology has no resource keys).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from lab.wire.address import split_address

DEFAULT_IMAGE = "loadlab:0.1.0"
DEFAULT_ETCD_IMAGE = "quay.io/coreos/etcd:v3.5.17"
DEFAULT_DYNAMO_IMAGE = "loadlab-dynamo:1.6.1"

#: The engine's gRPC port (inference, control, grpc.health.v1: the probes' port).
ENGINE_PORT = 50051
#: The frontend's HTTP port (Service and probes); a topology's frontend_port overrides it.
FRONTEND_PORT = 8000
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
#: Dynamo's sidecar: its system (health) server, its TCP request plane.
DYNAMO_SYSTEM_PORT = 9090

SIDECARS = ("lab", "dynamo")


@dataclass(frozen=True)
class Resources:
    cpu: str
    memory: str


@dataclass(frozen=True)
class RenderOptions:
    image: str = DEFAULT_IMAGE
    namespace: str | None = None
    # HOST:PORT of an etcd the user runs; None: render a one-member etcd StatefulSet
    etcd: str | None = None
    etcd_image: str = DEFAULT_ETCD_IMAGE
    sidecar: str = "lab"
    dynamo_image: str = DEFAULT_DYNAMO_IMAGE
    # with sidecar "dynamo": one DynamoGraphDeployment for Dynamo's operator (launch.k8s.dgd)
    # instead of plain Deployments
    dynamo_operator: bool = False
    # the model directory inside the image (tokenizer.json + config.json): Dynamo's sidecar
    # needs one (--model-path); the lab's stack uses the topology's `tokenizer`, if any
    model_path: str = "/models/lab"
    # the load client as an Indexed Job of this many shards (0: no Job)
    client_shards: int = 0
    client_conc: str | None = None  # `lab sweep --conc` (multiples of client_shards)
    # `lab sweep --rate` instead of --conc: each shard sends its stream of every rate level
    client_rate: str | None = None
    client_args: tuple[str, ...] = ()  # more `lab sweep` options, e.g. ("--isl", "512")
    results_claim: str | None = None  # an existing PVC for the shards' run directories
    engine: Resources = field(default_factory=lambda: Resources("1", "1Gi"))
    sidecar_res: Resources = field(default_factory=lambda: Resources("500m", "512Mi"))
    frontend: Resources = field(default_factory=lambda: Resources("1", "1Gi"))
    client: Resources = field(default_factory=lambda: Resources("1", "1Gi"))


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def object_prefix(run_name: str) -> str:
    """A topology name as the prefix of DNS-1123 object names ('_' and '.' become '-')."""
    prefix = re.sub(r"[_.]+", "-", run_name.lower()).strip("-")
    if not _DNS_LABEL.fullmatch(prefix) or len(prefix) > 30:
        raise ValueError(f"name {run_name!r}: the object prefix {prefix!r} must be 1-30 of "
                         "a-z 0-9 - (starting and ending with a letter or digit)")
    return prefix


def check_namespace(value: str) -> str:
    if not _DNS_LABEL.fullmatch(value) or len(value) > 63:
        raise ValueError(f"{value!r}: a namespace is 1-63 of a-z 0-9 -")
    return value


def check_etcd(value: str) -> str:
    """HOST:PORT of an existing etcd (its client URL without the scheme)."""
    split_address(value)
    return value
