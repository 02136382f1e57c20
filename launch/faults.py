"""Fault kinds `lab fault` and Stack.fault() inject, and the engine admin RPCs behind some."""

from __future__ import annotations

import asyncio

from launch.readiness import quiet_grpc_fork

# kind -> what it does
FAULT_KINDS: dict[str, str] = {
    "kill": "SIGKILL the process group",
    "stop": "SIGSTOP the process group (use `cont` to resume)",
    "cont": "SIGCONT the process group",
    "restart": "SIGTERM the process; the supervisor restarts it whatever its policy",
    "not-serving": "engine: admin SetHealth liveness NOT_SERVING",
    "serving": "engine: admin SetHealth liveness SERVING",
    "freeze": "engine: admin Freeze (engine loop stops)",
    "unfreeze": "engine: admin Freeze(false)",
    "executor-failure": "engine: admin ExecutorFailure (liveness NOT_SERVING, in-flight fail)",
}
ENGINE_ONLY = frozenset({"not-serving", "serving", "freeze", "unfreeze", "executor-failure"})


def _admin_call(address: str, kind: str, timeout: float) -> str:
    quiet_grpc_fork()
    import grpc
    from grpc_health.v1 import health_pb2

    from lab.wire.constants import HEALTH_LIVENESS
    from lab.wire.gen.loadlab.mocker.v1 import admin_pb2, admin_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = admin_pb2_grpc.AdminStub(channel)
        serving = health_pb2.HealthCheckResponse
        if kind == "not-serving":
            request = admin_pb2.SetHealthRequest(service=HEALTH_LIVENESS,
                                                 status=serving.NOT_SERVING)
            reply = stub.SetHealth(request, timeout=timeout)
        elif kind == "serving":
            request = admin_pb2.SetHealthRequest(service=HEALTH_LIVENESS, status=serving.SERVING)
            reply = stub.SetHealth(request, timeout=timeout)
        elif kind == "freeze":
            reply = stub.Freeze(admin_pb2.FreezeRequest(frozen=True), timeout=timeout)
        elif kind == "unfreeze":
            reply = stub.Freeze(admin_pb2.FreezeRequest(frozen=False), timeout=timeout)
        elif kind == "executor-failure":
            reply = stub.ExecutorFailure(
                admin_pb2.ExecutorFailureRequest(message="injected by lab fault"), timeout=timeout)
        else:
            raise ValueError(f"not an admin fault: {kind}")
    return reply.message


async def admin_fault(address: str, kind: str, timeout: float = 5.0) -> str:
    """Deliver an admin fault to the engine at `address`; raises RuntimeError on RPC failure."""
    quiet_grpc_fork()
    import grpc

    try:
        return await asyncio.to_thread(_admin_call, address, kind, timeout)
    except grpc.RpcError as exc:
        raise RuntimeError(f"admin {kind} at {address} failed: {exc.code().name} "
                           f"{exc.details()}") from exc
