"""Plain Kubernetes objects as dicts: containers, probes, workloads, services.

Only the fields the lab's manifests use; `launch.k8s.validate` checks the result against the
Kubernetes schemas, so a misspelt field fails there, not on a cluster.
"""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

#: Downward-API variables every lab pod gets: Kubernetes expands `$(NAME)` in command and args.
POD_NAME = "POD_NAME"
POD_IP = "POD_IP"
POD_NAMESPACE = "POD_NAMESPACE"


def ref(var: str) -> str:
    """`$(VAR)`: expanded by the kubelet in a container's command, args and env values."""
    return f"$({var})"


def downward_env() -> list[Obj]:
    return [
        {"name": POD_NAME, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": POD_NAMESPACE, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": POD_IP, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]


def env_values(values: dict[str, str]) -> list[Obj]:
    return [{"name": k, "value": v} for k, v in values.items()]


def resources(cpu: str, memory: str) -> Obj:
    """Requests = limits for memory (no overcommit of a load test); CPU request only (a limit
    throttles in 100 ms CFS periods, which shows up as latency spikes in the measurements)."""
    return {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory}}


def grpc_probe(port: int, service: str, period_s: int = 5, failures: int = 3) -> Obj:
    """A kubelet gRPC probe: grpc.health.v1 Check of `service` on the pod IP."""
    return {"grpc": {"port": port, "service": service}, "periodSeconds": period_s,
            "failureThreshold": failures, "timeoutSeconds": 2}


def http_probe(path: str, port: int, period_s: int = 5, failures: int = 3) -> Obj:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": period_s,
            "failureThreshold": failures, "timeoutSeconds": 2}


def container(name: str, image: str, argv: list[str], *, ports: dict[str, int] | None = None,
              env: list[Obj] | None = None, readiness: Obj | None = None,
              liveness: Obj | None = None, startup: Obj | None = None,
              res: Obj | None = None, mounts: list[Obj] | None = None,
              sidecar: bool = False) -> Obj:
    """`argv[0]` becomes `command`, the rest `args`; `sidecar`: a native sidecar (an init
    container with `restartPolicy: Always`, started before the main containers, kept running,
    stopped after them)."""
    out: Obj = {"name": name, "image": image, "command": argv[:1], "args": argv[1:]}
    if sidecar:
        out["restartPolicy"] = "Always"
    if ports:
        out["ports"] = [{"name": n, "containerPort": p, "protocol": "TCP"}
                        for n, p in ports.items()]
    if env:
        out["env"] = env
    for key, probe in (("readinessProbe", readiness), ("livenessProbe", liveness),
                       ("startupProbe", startup)):
        if probe is not None:
            out[key] = probe
    if res is not None:
        out["resources"] = res
    if mounts:
        out["volumeMounts"] = mounts
    return out


def metadata(name: str, labels: dict[str, str], namespace: str | None) -> Obj:
    meta: Obj = {"name": name, "labels": dict(labels)}
    if namespace:
        meta["namespace"] = namespace
    return meta


def pod_spec(containers: list[Obj], *, init: list[Obj] | None = None,
             volumes: list[Obj] | None = None, grace_s: float | None = None,
             restart: str | None = None) -> Obj:
    spec: Obj = {"containers": containers}
    if init:
        spec["initContainers"] = init
    if volumes:
        spec["volumes"] = volumes
    if grace_s is not None:
        spec["terminationGracePeriodSeconds"] = int(grace_s + 0.999)
    if restart is not None:
        spec["restartPolicy"] = restart
    return spec


def deployment(name: str, labels: dict[str, str], pod: Obj, replicas: int,
               namespace: str | None) -> Obj:
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": metadata(name, labels, namespace),
        "spec": {"replicas": replicas, "selector": {"matchLabels": dict(labels)},
                 "template": {"metadata": {"labels": dict(labels)}, "spec": pod}},
    }


def statefulset(name: str, labels: dict[str, str], pod: Obj, service: str,
                namespace: str | None) -> Obj:
    return {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": metadata(name, labels, namespace),
        "spec": {"replicas": 1, "serviceName": service,
                 "selector": {"matchLabels": dict(labels)},
                 "template": {"metadata": {"labels": dict(labels)}, "spec": pod}},
    }


def service(name: str, selector: dict[str, str], ports: dict[str, int],
            namespace: str | None, headless: bool = False) -> Obj:
    spec: Obj = {"selector": dict(selector),
                 "ports": [{"name": n, "port": p, "targetPort": p, "protocol": "TCP"}
                           for n, p in ports.items()]}
    if headless:
        spec["clusterIP"] = "None"
        spec["publishNotReadyAddresses"] = True
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": metadata(name, selector, namespace), "spec": spec}


def indexed_job(name: str, labels: dict[str, str], pod: Obj, completions: int,
                namespace: str | None) -> Obj:
    """Every index runs once, all at once; a failed pod is not retried (a retried shard would
    measure a different load than the other shards)."""
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": metadata(name, labels, namespace),
        "spec": {"completionMode": "Indexed", "completions": completions,
                 "parallelism": completions, "backoffLimit": 0,
                 "template": {"metadata": {"labels": dict(labels)}, "spec": pod}},
    }
