"""Readiness probes: engine health SERVING, sidecar registered, frontend /health 200.

Each probe returns (ok, detail); blocking calls run in a worker thread so the launcher's event
loop (and whatever shares it, e.g. a sweep's load generator) is never blocked.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.error
import urllib.request
from pathlib import Path


def quiet_grpc_fork() -> None:
    """The launcher forks children while probe threads use gRPC; its fork handlers would only
    print "skipping fork() handlers" (children exec at once). Must run before grpc is imported."""
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")


def _grpc_health(address: str, service: str, timeout: float) -> tuple[bool, str]:
    quiet_grpc_fork()
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as exc:
            return False, f"health Check failed: {exc.code().name}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, f"health is {status}"


async def engine_serving(address: str, timeout: float = 1.0) -> tuple[bool, str]:
    """grpc.health.v1 Check on the overall service "" is SERVING."""
    return await asyncio.to_thread(_grpc_health, address, "", timeout)


def registry_dir(discovery: str) -> Path | None:
    scheme, _, rest = discovery.partition(":")
    return Path(rest) if scheme == "file" and rest else None


async def sidecar_registered(discovery: str, worker_id: str, pid: int | None) -> tuple[bool, str]:
    """The worker's record is in the file registry (written by this incarnation when it says so)."""
    directory = registry_dir(discovery)
    if directory is None:
        return True, "registered (not checkable for this discovery)"
    path = directory / f"{worker_id}.json"
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return False, f"not registered in {directory}"
    record_pid = record.get("pid") or 0
    if pid is not None and record_pid and record_pid != pid:
        return False, f"registry holds a record of pid {record_pid}, not of pid {pid}"
    return True, f"registered as {record.get('address')}"


def _http_health(url: str, timeout: float) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            body = reply.read(4096).decode(errors="replace")
    except urllib.error.HTTPError as exc:
        body = exc.read(300).decode(errors="replace")
        return False, f"{url} returned {exc.code} {body}".strip()
    except (OSError, ValueError) as exc:
        return False, f"{url}: {exc}"
    # 200 also means "degraded" (serving, but not every expected worker is registered): the
    # stack is ready only when the frontend says "healthy".
    try:
        status = json.loads(body).get("status")
    except (ValueError, AttributeError):
        status = None
    return status == "healthy", f"{url} returned 200 {body[:300]}".strip()


async def frontend_healthy(address: str, timeout: float = 1.0) -> tuple[bool, str]:
    return await asyncio.to_thread(_http_health, f"http://{address}/health", timeout)
