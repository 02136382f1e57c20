"""The lab's own serving path on Kubernetes: per engine a pod (engine + `lab sidecar` as a
native sidecar), the frontend as a Deployment behind a Service, etcd discovery.

Every command line is the launcher's (`launch.commands`): the same settings models, the same
argv, with Kubernetes' addresses: fixed ports where a probe or a Service needs one, `$(POD_IP)`
where a worker advertises itself in discovery, `$(POD_NAME)` as the worker's id.
"""

from __future__ import annotations

import dataclasses

from launch.commands import Programs, engine_settings, frontend_argv, sidecar_argv
from launch.k8s import objects as k
from launch.k8s.client_job import client_objects
from launch.k8s.etcd import etcd_endpoint, etcd_objects
from launch.k8s.names import Names
from launch.k8s.options import ENGINE_PORT, FRONTEND_PORT, RenderOptions
from launch.topology import FleetSpec, TopologySpec

#: The image's console scripts (launch/k8s/Dockerfile installs the package).
IMAGE_PROGRAMS = Programs(mocker=["mocker"], lab=["lab"])
#: Bind every address of the pod: the kubelet probes the pod IP, the Service routes to it.
ALL_ADDRESSES = "0.0.0.0"
#: Containers of one pod share its network namespace: the sidecar reaches its engine here.
IN_POD_ENGINE = f"127.0.0.1:{ENGINE_PORT}"


def frontend_port(spec: TopologySpec) -> int:
    return spec.frontend_port or FRONTEND_PORT


def lab_objects(spec: TopologySpec, opts: RenderOptions, names: Names) -> list[k.Obj]:
    discovery, out = etcd_objects(opts, names)
    for index, fleet in enumerate(spec.fleets):
        out.append(_worker_deployment(spec, fleet, index, discovery, opts, names))
    out.extend(_frontend(spec, discovery, opts, names))
    if opts.client_shards:
        target = f"http://{names.frontend}:{frontend_port(spec)}"
        out.extend(client_objects(opts, names, target, spec.model, etcd_endpoint(opts, names),
                                  "/health"))
    return out


def engine_argv(spec: TopologySpec, fleet: FleetSpec) -> list[str]:
    """The launcher's engine settings (`launch.commands.engine_settings`) on the pod's fixed
    gRPC port, without the fault-injection service: `lab fault` does not reach a cluster, and
    its Exit/Freeze RPCs must not be open on the pod network."""
    settings = engine_settings(spec, fleet, k.ref(k.POD_NAME), port=ENGINE_PORT,
                               host=ALL_ADDRESSES).model_copy(update={"admin_listen": None})
    return [*IMAGE_PROGRAMS.mocker, "serve", *settings.to_argv(), *fleet.extra_mocker_args]


def _worker_deployment(spec: TopologySpec, fleet: FleetSpec, index: int, discovery: str,
                       opts: RenderOptions, names: Names) -> k.Obj:
    pod_name = k.ref(k.POD_NAME)
    engine = k.container(
        "engine", opts.image,
        engine_argv(spec, fleet),
        ports={"grpc": ENGINE_PORT}, env=k.downward_env(),
        # readiness: `inference` (NOT_SERVING while paused or draining); liveness: `liveness`,
        # the service the lab's sidecar watches too (lab/serve/sidecar/liveness.py)
        readiness=k.grpc_probe(ENGINE_PORT, "inference"),
        liveness=k.grpc_probe(ENGINE_PORT, "liveness"),
        res=k.resources(opts.engine.cpu, opts.engine.memory))
    sidecar = k.container(
        "sidecar", opts.image,
        sidecar_argv(IMAGE_PROGRAMS, spec, fleet, IN_POD_ENGINE, discovery, pod_name,
                     host=k.ref(k.POD_IP)),
        env=k.downward_env(), res=k.resources(opts.sidecar_res.cpu, opts.sidecar_res.memory),
        sidecar=True)
    pod = k.pod_spec([engine], init=[sidecar], grace_s=spec.grace_s)
    name, labels = names.worker(spec, index)
    return k.deployment(name, labels, pod, fleet.count, opts.namespace)


def _frontend(spec: TopologySpec, discovery: str, opts: RenderOptions,
              names: Names) -> list[k.Obj]:
    port = frontend_port(spec)
    fixed = dataclasses.replace(spec, frontend_port=port)
    frontend = k.container(
        "frontend", opts.image, frontend_argv(IMAGE_PROGRAMS, fixed, discovery, ALL_ADDRESSES),
        ports={"http": port}, env=k.downward_env(),
        # /health is 200 "healthy" once every expected worker is in discovery; /live is the
        # process answering (a frontend waiting for workers must not be restarted)
        readiness=k.http_probe("/health", port), liveness=k.http_probe("/live", port),
        res=k.resources(opts.frontend.cpu, opts.frontend.memory))
    labels = names.labels("frontend")
    return [
        k.deployment(names.frontend, labels, k.pod_spec([frontend], grace_s=spec.grace_s), 1,
                     opts.namespace),
        k.service(names.frontend, labels, {"http": port}, opts.namespace),
    ]
