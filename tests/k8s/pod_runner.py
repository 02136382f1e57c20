"""Run rendered manifests as local processes, the way a kubelet would run their pods.

No cluster runs on the test machines (no container runtime, no kube-apiserver), so the tests
prove the manifests' commands instead: every container is started with exactly its manifest's
command, args and env, with these substitutions, and nothing else:

* the downward API: POD_NAME = `<workload>-<replica>`, POD_IP = 127.0.0.1, POD_NAMESPACE =
  default; `$(VAR)` in command and args is expanded as the kubelet does (`$$` escapes);
* ports: every pod shares 127.0.0.1, so each containerPort of a pod gets a port of its own,
  picked by the OS and held (`launch/port_hold.py`) until the pod's probes pass, so nothing else
  takes it between the pick and the container's bind; and `HOST:PORT` of that port (in args,
  env values and probes), or an arg that is that port alone, is rewritten to it; `0.0.0.0`
  becomes 127.0.0.1 (nothing listens beyond loopback);
* Service names: `NAME:PORT` of a Service becomes 127.0.0.1 and the remapped targetPort of the
  one pod it selects (the tests' Services select one pod each);
* the Job's downward API: pod I of an Indexed Job gets the completion-index annotation I, and
  every pod of the Job the same `batch.kubernetes.io/controller-uid` label (a fresh uuid);
* volumes: a mountPath becomes a directory under the test's tmp dir: one per pod for an
  emptyDir, one per claim for a persistentVolumeClaim (shared by the pods that mount it);
* programs: `mocker`, `lab` and `python3` are the venv's, beside this interpreter (the
  image's PATH), or for an image in `interpreters` (Dynamo's) `python3` is that interpreter;
  anything else (etcd) is looked up on PATH;
* paths inside an image (`paths`, e.g. the model dir /models/lab) become local paths.

Pods start in file order; in a pod the init containers run first, as the kubelet runs them: a
native sidecar (`restartPolicy: Always`) is started and kept running, any other init
container must exit 0 before the next container starts. A
StatefulSet's pod (etcd) must be ready before the next object starts, because this runner does
not restart a crashed container the way the kubelet would.
"""

from __future__ import annotations

import re
import shutil
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from launch.port_hold import PortHold
from tests.procs import Proc

LOOPBACK = "127.0.0.1"
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
_HOSTPORT = re.compile(r"(?P<host>[A-Za-z0-9_.\-]+):(?P<port>\d+)\b")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: a defined VAR is replaced, an undefined one kept."""
    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env.get(name, m.group(0))

    return _VAR.sub(sub, text)


@dataclass
class Pod:
    name: str
    labels: dict[str, str]
    spec: dict[str, Any]
    ports: dict[int, int] = field(default_factory=dict)  # containerPort -> local port
    mounts: dict[str, Path] = field(default_factory=dict)  # mountPath -> local dir
    procs: list[tuple[dict[str, Any], Proc]] = field(default_factory=list)
    kind: str = "Deployment"
    downward: dict[str, str] = field(default_factory=dict)  # fieldPath -> value
    holds: list[PortHold] = field(default_factory=list)  # its ports, held until it is ready

    def release_ports(self) -> None:
        """Its containers listen on their ports now: stop holding them."""
        for hold in self.holds:
            hold.close()
        self.holds.clear()

    def containers(self) -> list[dict[str, Any]]:
        """Start order: init containers, then the main containers."""
        return [*self.spec.get("initContainers", []), *self.spec["containers"]]

    def main_procs(self) -> list[Proc]:
        names = {c["name"] for c in self.spec["containers"]}
        return [proc for c, proc in self.procs if c["name"] in names]


@dataclass
class Cluster:
    """The pods of a manifest set, started by `start`; every process through `spawn`."""

    objects: list[dict[str, Any]]
    workdir: Path
    pods: list[Pod] = field(default_factory=list)
    services: dict[str, str] = field(default_factory=dict)  # "NAME:PORT" -> "127.0.0.1:P"
    interpreters: dict[str, str] = field(default_factory=dict)  # image -> its python3
    paths: dict[str, Path] = field(default_factory=dict)  # path in the image -> local path

    def plan(self) -> None:
        for obj in self.objects:
            if obj["kind"] not in ("Deployment", "StatefulSet", "Job"):
                continue
            template = obj["spec"]["template"]
            job_uid = str(uuid.uuid4())
            count = obj["spec"]["completions" if obj["kind"] == "Job" else "replicas"]
            for replica in range(count):
                pod = Pod(f"{obj['metadata']['name']}-{replica}", template["metadata"]["labels"],
                          template["spec"], kind=obj["kind"])
                pod.downward = {"metadata.name": pod.name, "status.podIP": LOOPBACK,
                                "metadata.namespace": "default"}
                if obj["kind"] == "Job":
                    pod.downward.update({
                        "metadata.annotations['batch.kubernetes.io/job-completion-index']":
                            str(replica),
                        "metadata.labels['batch.kubernetes.io/controller-uid']": job_uid})
                volumes = {v["name"]: v for v in template["spec"].get("volumes", [])}
                for c in pod.containers():
                    for p in c.get("ports", []):
                        hold = PortHold(LOOPBACK)
                        pod.holds.append(hold)
                        pod.ports[p["containerPort"]] = hold.port
                    for m in c.get("volumeMounts", []):
                        claim = volumes[m["name"]].get("persistentVolumeClaim")
                        pod.mounts[m["mountPath"]] = (
                            self.workdir / "claims" / claim["claimName"] if claim
                            else self.workdir / pod.name / m["name"])
                self.pods.append(pod)
        for obj in self.objects:
            if obj["kind"] != "Service":
                continue
            selector = obj["spec"]["selector"]
            chosen = [p for p in self.pods
                      if all(p.labels.get(k) == v for k, v in selector.items())]
            assert len(chosen) == 1, f"Service {obj['metadata']['name']} selects {len(chosen)}"
            for port in obj["spec"]["ports"]:
                target = chosen[0].ports.get(port["targetPort"])
                assert target is not None, (f"Service {obj['metadata']['name']}: targetPort "
                                            f"{port['targetPort']} is no container port")
                self.services[f"{obj['metadata']['name']}:{port['port']}"] = \
                    f"{LOOPBACK}:{target}"

    def rewrite(self, pod: Pod, text: str) -> str:
        def sub(m: re.Match[str]) -> str:
            whole = m.group(0)
            if whole in self.services:
                return self.services[whole]
            port = int(m.group("port"))
            host = LOOPBACK if m.group("host") == "0.0.0.0" else m.group("host")
            return f"{host}:{pod.ports.get(port, port)}"

        if text.isdigit() and int(text) in pod.ports:  # a port on its own (`--http-port 8000`)
            return str(pod.ports[int(text)])
        if text == "0.0.0.0":  # a host on its own (`--http-host 0.0.0.0`)
            return LOOPBACK
        text = _HOSTPORT.sub(sub, text)
        for mount, local in [*pod.mounts.items(), *self.paths.items()]:
            text = text.replace(mount, str(local))
        return text

    def argv_env(self, pod: Pod, c: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
        env: dict[str, str] = {}
        for e in c.get("env", []):
            if "valueFrom" in e:
                env[e["name"]] = pod.downward[e["valueFrom"]["fieldRef"]["fieldPath"]]
            else:
                env[e["name"]] = self.rewrite(pod, expand(e["value"], env))
        argv = [self.rewrite(pod, expand(a, env)) for a in [*c["command"], *c.get("args", [])]]
        beside = Path(sys.executable).parent / argv[0]
        if argv[0] == "python3" and c["image"] in self.interpreters:
            found: str | None = self.interpreters[c["image"]]
        else:
            found = str(beside) if beside.exists() else shutil.which(argv[0])
        assert found, f"{argv[0]} is not installed"
        return [found, *argv[1:]], env

    def start(self, spawn: Callable[..., Proc], timeout_s: float = 90.0) -> None:
        self.plan()
        for pod in self.pods:
            for path in pod.mounts.values():
                path.mkdir(parents=True, exist_ok=True)
            init = {c["name"] for c in pod.spec.get("initContainers", [])
                    if c.get("restartPolicy") != "Always"}
            for c in pod.containers():
                argv, env = self.argv_env(pod, c)
                proc = spawn(f"{pod.name}.{c['name']}", argv, ready=False, env=env)
                pod.procs.append((c, proc))
                if c["name"] in init:
                    code = proc.popen.wait(timeout_s)
                    assert code == 0, f"init container {proc.name} exited {code}:\n{proc.log()}"
            if pod.kind == "StatefulSet":
                self.wait_ready([pod], timeout_s)

    # -- probes -------------------------------------------------------------------------------

    def probe_ok(self, pod: Pod, probe: dict[str, Any]) -> bool:
        if "grpc" in probe:
            local = pod.ports.get(probe["grpc"]["port"])
            assert local is not None, f"{pod.name}: probe port {probe['grpc']['port']} is no " \
                "container port of the pod"
            with grpc.insecure_channel(f"{LOOPBACK}:{local}") as channel:
                try:
                    resp = health_pb2_grpc.HealthStub(channel).Check(
                        health_pb2.HealthCheckRequest(service=probe["grpc"]["service"]),
                        timeout=2)
                except grpc.RpcError:
                    return False
                return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)
        get = probe["httpGet"]
        local = pod.ports.get(get["port"])
        assert local is not None, f"{pod.name}: probe port {get['port']} is no container port"
        try:
            with urllib.request.urlopen(f"http://{LOOPBACK}:{local}{get['path']}",
                                        timeout=2) as resp:
                return 200 <= resp.status < 400
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, pods: list[Pod] | None = None, timeout_s: float = 90.0) -> None:
        """Every readiness and liveness probe of the pods passes (the kubelet's Ready)."""
        pods = self.pods if pods is None else pods
        deadline = time.monotonic() + timeout_s
        pending = [(pod, c, proc, probe) for pod in pods if pod.kind != "Job"
                   for c, proc in pod.procs
                   for key in ("readinessProbe", "livenessProbe")
                   if (probe := c.get(key)) is not None]
        assert pending, "no probes to wait on"
        while pending:
            for _pod, _c, proc, _probe in pending:
                if proc.popen.poll() is not None:
                    raise AssertionError(f"{proc.name} exited {proc.popen.returncode}:\n"
                                         f"{proc.log()[-3000:]}")
            pending = [p for p in pending if not self.probe_ok(p[0], p[3])]
            if pending and time.monotonic() > deadline:
                raise AssertionError("probes not passing: " + ", ".join(
                    f"{pod.name}.{c['name']} {probe}" for pod, c, _, probe in pending))
            if pending:
                time.sleep(0.2)
        for pod in pods:
            pod.release_ports()

    def release_ports(self) -> None:
        """Stop holding every pod's ports (what `wait_ready` does for the pods it waited on)."""
        for pod in self.pods:
            pod.release_ports()

    def service_url(self, name: str, port: int) -> str:
        return f"http://{self.services[f'{name}:{port}']}"
