"""loadlab.mocker.v1.Admin: fault injection for tests and `lab fault`.

Served only when asked (`mocker serve --admin-listen HOST:PORT`, which the launcher passes), on
its own gRPC server, never on the inference port. Arguments are bounded: a known health service
and a ServingStatus, 0 <= StallTokens seconds <= MAX_ADMIN_STALL_S, an Exit code in 0-255.

SetHealth sets one grpc.health.v1 service's status; StallTokens holds token delivery to clients
for N seconds (the engine keeps running; 0 resumes); Freeze stops/resumes the engine loop (no
passes, GetLoad's timestamp stops advancing); Exit ends the process with a code right after
answering (no graceful stop: a crash); ExecutorFailure sets liveness NOT_SERVING and ends every
in-flight request with an in-band INTERNAL error (new requests: UNAVAILABLE).
"""

from __future__ import annotations

import asyncio
import logging
import os

import grpc

from lab.wire import constants as wc

from .config import ADMIN_EXIT_CODES, MAX_ADMIN_STALL_S
from .health import NOT_SERVING
from .pb import admin_pb2, admin_pb2_grpc, health_pb2
from .state import ServerState

log = logging.getLogger("mocker.server")

#: Let the Exit reply reach the client before the process goes away.
EXIT_DELAY_S = 0.05


class Admin(admin_pb2_grpc.AdminServicer):
    def __init__(self, state: ServerState) -> None:
        self._st = state

    async def SetHealth(self, request, context):
        if request.service not in wc.HEALTH_SERVICES:
            known = ", ".join(repr(s) for s in wc.HEALTH_SERVICES)
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"service {request.service[:64]!r} is not a health service of this engine "
                f"({known})",
            )
        if request.status not in health_pb2.HealthCheckResponse.ServingStatus.values():
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"status {request.status} is not a ServingStatus"
            )
        self._st.health.set(request.service, request.status)
        name = health_pb2.HealthCheckResponse.ServingStatus.Name(request.status)
        log.warning("admin: health %r set to %s", request.service, name)
        return admin_pb2.AdminReply(message=f"{request.service!r} is {name}")

    async def StallTokens(self, request, context):
        seconds = request.seconds
        if not 0 <= seconds <= MAX_ADMIN_STALL_S:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"seconds must be in [0, {MAX_ADMIN_STALL_S:g}], got {seconds!r}",
            )
        self._st.stall_tokens(seconds)
        log.warning("admin: token delivery stalled for %g s", seconds)
        return admin_pb2.AdminReply(
            message=f"stalling tokens for {seconds:g} s" if seconds else "tokens flowing"
        )

    async def Freeze(self, request, context):
        self._st.engine.freeze(request.frozen)
        log.warning("admin: engine loop %s", "frozen" if request.frozen else "unfrozen")
        return admin_pb2.AdminReply(message="frozen" if request.frozen else "running")

    async def Exit(self, request, context):
        code = request.code
        if code not in ADMIN_EXIT_CODES:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"code must be in 0-255, got {code}"
            )
        log.warning("admin: exiting with code %d", code)
        asyncio.get_running_loop().call_later(EXIT_DELAY_S, os._exit, code)
        return admin_pb2.AdminReply(message=f"exiting with code {code}")

    async def ExecutorFailure(self, request, context):
        st = self._st
        st.health.set(wc.HEALTH_LIVENESS, NOT_SERVING)
        failed = st.fail_executor(request.message)
        log.error("admin: simulated executor failure (%s); %d request(s) failed",
                  st.executor_failure, failed)
        return admin_pb2.AdminReply(
            message=f"executor failed; {failed} in-flight request(s) failed"
        )
