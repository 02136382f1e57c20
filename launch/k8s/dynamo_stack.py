"""`--sidecar dynamo`: Dynamo 1.6.1's own arrangement with the lab's mocker as the engine.

Per engine a pod: `mocker serve` (the launcher's engine settings, emitting the model dir's
vocabulary: `--tokenizer` the model dir) with Dynamo's TensorRT-LLM sidecar
(`python3 -m dynamo.trtllm.sidecar`) as a native sidecar; Dynamo's frontend
(`python3 -m dynamo.frontend`) as a Deployment behind a Service. The flags and environment are
those of the interop tests (tests/interop/dynamo_stack.py, docs/interop.md) with Kubernetes'
addresses: etcd discovery (ETCD_ENDPOINTS) instead of a shared directory, and each process
advertising its pod's IP on the TCP request plane and the ZMQ event plane.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from launch.k8s import objects as k
from launch.k8s.client_job import client_objects
from launch.k8s.etcd import etcd_endpoint, etcd_objects
from launch.k8s.lab_stack import IN_POD_ENGINE, engine_argv, frontend_port
from launch.k8s.names import Names
from launch.k8s.options import ENGINE_PORT, RenderOptions
from launch.topology import FleetSpec, TopologySpec

COMMON = ["--discovery-backend", "etcd", "--request-plane", "tcp"]
#: Dynamo's sidecar --disaggregation-mode per lab role (none for aggregated).
MODES = {"prefill": "prefill", "decode": "decode"}


def dynamo_env(etcd: str) -> list[k.Obj]:
    pod_ip = k.ref(k.POD_IP)
    return [*k.downward_env(), *k.env_values({
        "ETCD_ENDPOINTS": f"http://{etcd}",
        "DYN_DISCOVERY_BACKEND": "etcd",
        "DYN_REQUEST_PLANE": "tcp",
        "DYN_EVENT_PLANE": "zmq",
        "DYN_TCP_RPC_HOST": pod_ip,
        "DYN_TCP_RESPONSE_STREAM_HOST": pod_ip,
        "DYN_EVENT_PLANE_HOST": pod_ip,
        "DYN_SELF_HOST_METADATA": "0",  # model cards stay in the discovery store
        "DYN_LOG": "warn,dynamo_llm::discovery::watcher=info",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    })]


def sidecar_argv(model_path: str, role: str, common: Sequence[str] = COMMON) -> list[str]:
    """`common`: the discovery and request-plane flags (none under Dynamo's operator, which
    sets them for its platform)."""
    argv = ["python3", "-m", "dynamo.trtllm.sidecar", "--model-path", model_path,
            "--grpc-endpoint", IN_POD_ENGINE, *common]
    if role in MODES:
        argv += ["--disaggregation-mode", MODES[role]]
    return argv


def frontend_argv(port: int, router: str, common: Sequence[str] = COMMON) -> list[str]:
    return ["python3", "-m", "dynamo.frontend", "--http-host", "0.0.0.0", "--http-port",
            str(port), "--router-mode", router, *common]


def dynamo_objects(spec: TopologySpec, opts: RenderOptions, names: Names) -> list[k.Obj]:
    # the engines emit only ids of the model dir's vocabulary (docs/interop.md)
    spec = dataclasses.replace(spec, tokenizer=opts.model_path)
    _, out = etcd_objects(opts, names)
    etcd = etcd_endpoint(opts, names)
    for index, fleet in enumerate(spec.fleets):
        out.append(_worker(spec, fleet, index, etcd, opts, names))
    port = frontend_port(spec)
    frontend = k.container(
        "frontend", opts.dynamo_image, frontend_argv(port, spec.router),
        ports={"http": port}, env=dynamo_env(etcd),
        readiness=k.http_probe("/health", port), liveness=k.http_probe("/live", port),
        res=k.resources(opts.frontend.cpu, opts.frontend.memory))
    labels = names.labels("frontend")
    out += [k.deployment(names.frontend, labels, k.pod_spec([frontend], grace_s=spec.grace_s),
                         1, opts.namespace),
            k.service(names.frontend, labels, {"http": port}, opts.namespace)]
    if opts.client_shards:
        # Dynamo serves the model under its --model-path; prompts exact in its tokenizer
        out += client_objects(opts, names, f"http://{names.frontend}:{port}", opts.model_path,
                              etcd, "/health", ("--tokenizer", opts.model_path))
    return out


def engine_container(spec: TopologySpec, fleet: FleetSpec, opts: RenderOptions) -> k.Obj:
    """The lab's mocker as the engine: gRPC on ENGINE_PORT, probed by grpc.health.v1."""
    return k.container(
        "engine", opts.image, engine_argv(spec, fleet), ports={"grpc": ENGINE_PORT},
        env=k.downward_env(),
        readiness=k.grpc_probe(ENGINE_PORT, "inference"),
        liveness=k.grpc_probe(ENGINE_PORT, "liveness"),
        res=k.resources(opts.engine.cpu, opts.engine.memory))


def _worker(spec: TopologySpec, fleet: FleetSpec, index: int, etcd: str, opts: RenderOptions,
            names: Names) -> k.Obj:
    engine = engine_container(spec, fleet, opts)
    sidecar = k.container(
        "sidecar", opts.dynamo_image, sidecar_argv(opts.model_path, fleet.role),
        env=dynamo_env(etcd), res=k.resources(opts.sidecar_res.cpu, opts.sidecar_res.memory),
        sidecar=True)
    name, labels = names.worker(spec, index)
    return k.deployment(name, labels, k.pod_spec([engine], init=[sidecar], grace_s=spec.grace_s),
                        fleet.count, opts.namespace)
