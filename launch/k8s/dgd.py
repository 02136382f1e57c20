"""`--sidecar dynamo --dynamo-operator`: the seed's arrangement as one DynamoGraphDeployment.

Dynamo's operator (nvidia.com/v1beta1, `spec.components`) deploys a graph from one custom
resource: per component a `type` (frontend / worker / prefill / decode), `replicas` and a
`podTemplate` whose container named `main` runs Dynamo's process, into which the operator merges
its defaults (discovery and request-plane environment, system port, probes). The shape follows
Dynamo's TRT-LLM examples (examples/backends/trtllm/deploy/v1beta1/openengine-agg.yaml and
openengine-disagg.yaml): the frontend component's `main` runs `python3 -m dynamo.frontend`; a
worker component's `main` is the TRT-LLM sidecar, beside the engine container in the same pod,
reaching it on 127.0.0.1. Here the engine is the lab's mocker (`mocker serve`, as under the
plain `--sidecar dynamo` render) and the sidecar Dynamo 1.6.1's `dynamo.trtllm.sidecar`.

Discovery and the request plane are the operator's platform's, so the Dynamo processes get no
`--discovery-backend`/`--request-plane` flags and no etcd is rendered for them. The client Job
(`--client-shards`) still meets at an etcd barrier: the one `--etcd` names, or the small etcd
StatefulSet rendered for it.
"""

from __future__ import annotations

import dataclasses

from launch.k8s import objects as k
from launch.k8s.client_job import client_objects
from launch.k8s.crd import DGD_API_VERSION, DGD_KIND
from launch.k8s.dynamo_stack import engine_container, frontend_argv, sidecar_argv
from launch.k8s.etcd import etcd_endpoint, etcd_objects
from launch.k8s.lab_stack import frontend_port
from launch.k8s.names import Names
from launch.k8s.options import RenderOptions
from launch.topology import FleetSpec, TopologySpec

#: The operator merges its defaults into the container of this name.
MAIN = "main"
#: A lab fleet's role -> the DGD component's type and its name's stem.
COMPONENT_TYPES = {"aggregated": ("worker", "Worker"), "prefill": ("prefill", "PrefillWorker"),
                   "decode": ("decode", "DecodeWorker")}
FRONTEND_COMPONENT = "Frontend"


def dgd_objects(spec: TopologySpec, opts: RenderOptions, names: Names) -> list[k.Obj]:
    """The DynamoGraphDeployment, then (with --client-shards) the barrier's etcd and the
    client Job against the operator's frontend Service."""
    spec = dataclasses.replace(spec, tokenizer=opts.model_path)  # the model dir's vocabulary
    port = frontend_port(spec)
    components = [_frontend(spec, opts, port)]
    components += [_worker(spec, fleet, index, opts) for index, fleet in enumerate(spec.fleets)]
    out: list[k.Obj] = [{
        "apiVersion": DGD_API_VERSION, "kind": DGD_KIND,
        "metadata": k.metadata(names.prefix, names.labels("graph"), opts.namespace),
        "spec": {"backendFramework": "trtllm", "components": components},
    }]
    if opts.client_shards:
        if opts.etcd is None:
            out += etcd_objects(opts, names)[1]
        # the operator's Service of a component: <graph name>-<component name, lower case>
        target = f"http://{names.prefix}-{FRONTEND_COMPONENT.lower()}:{port}"
        out += client_objects(opts, names, target, opts.model_path, etcd_endpoint(opts, names),
                              "/health", ("--tokenizer", opts.model_path))
    return out


def _frontend(spec: TopologySpec, opts: RenderOptions, port: int) -> k.Obj:
    main = k.container(MAIN, opts.dynamo_image, frontend_argv(port, spec.router, common=()),
                       ports={"http": port},
                       res=k.resources(opts.frontend.cpu, opts.frontend.memory))
    return {"name": FRONTEND_COMPONENT, "type": "frontend", "replicas": 1,
            "podTemplate": {"spec": {"containers": [main]}}}


def component_name(spec: TopologySpec, index: int) -> str:
    """`Worker`, `PrefillWorker`, `DecodeWorker`; `-k` added when fleets share a role."""
    role = spec.fleets[index].role
    same = [i for i, f in enumerate(spec.fleets) if f.role == role]
    stem = COMPONENT_TYPES[role][1]
    return f"{stem}-{same.index(index)}" if len(same) > 1 else stem


def _worker(spec: TopologySpec, fleet: FleetSpec, index: int, opts: RenderOptions) -> k.Obj:
    main = k.container(MAIN, opts.dynamo_image,
                       sidecar_argv(opts.model_path, fleet.role, common=()),
                       res=k.resources(opts.sidecar_res.cpu, opts.sidecar_res.memory))
    pod = k.pod_spec([main, engine_container(spec, fleet, opts)], grace_s=spec.grace_s)
    return {"name": component_name(spec, index), "type": COMPONENT_TYPES[fleet.role][0],
            "replicas": fleet.count, "podTemplate": {"spec": pod}}
