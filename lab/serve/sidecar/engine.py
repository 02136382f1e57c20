"""The sidecar's gRPC link to its engine: the start-up handshake, control RPCs and Generate.

Everything goes over ONE HTTP/2 connection, lab.wire.h2grpc's channel: Generate (the per-token
stream: a whole recv() of frames parsed in one pass instead of grpc.aio's per-message
machinery), the unary control RPCs (GetServerInfo, GetModelInfo, GetLoad, Abort) and the
liveness Health/Watch. So the watch follows the very connection that carries the tokens: a
connection that dies ends the watch and every stream together.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import grpc

from lab.serve.sidecar.convert import ROLE_NAMES, EngineFacts
from lab.shared.settings import DEFAULT_MODEL, SidecarTiming
from lab.shared.sidecar_settings import STARTUP_WAIT_PREFIX
from lab.wire.address import split_address
from lab.wire.constants import MAX_GRPC_MESSAGE_BYTES
from lab.wire.gen.openengine.v1 import (
    lifecycle_pb2,
    model_pb2,
    openengine_pb2_grpc,
    server_pb2,
)
from lab.wire.h2grpc import H2GrpcChannel

log = logging.getLogger(__name__)

MAX_MESSAGE = MAX_GRPC_MESSAGE_BYTES
CONTROL_TIMEOUT_S = 30.0  # one-shot control RPCs (GetModelInfo, Abort)
#: How often the start-up wait logs while the reason stays the same (`lab ps` shows the latest).
RETRY_LOG_EVERY_S = 10.0


class StartupError(RuntimeError):
    """The engine cannot be used (unreachable by the deadline, or incomplete model info)."""


async def tcp_refusal(target: str, timeout_s: float) -> str | None:
    """Why the engine's port takes no TCP connection ("connection refused", ...), or None when
    it accepts one (the connection is closed at once)."""
    host, port = split_address(target)
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(host, port)
    except TimeoutError:
        return f"no TCP answer within {timeout_s:g} s"
    except ConnectionRefusedError:
        return "connection refused"
    except OSError as exc:
        return exc.strerror.lower() if exc.strerror else type(exc).__name__
    writer.close()
    return None


class StartupWait:
    """What the start-up wait for the engine says in the log: the reason, since when (wall
    clock) and the attempt count, once at the first failure, again when the reason changes, and
    every RETRY_LOG_EVERY_S. `lab ps` shows the latest such line for a sidecar not yet ready."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.attempts = 0
        self.reason: str | None = None
        self.since = ""
        self._last_log = float("-inf")

    def failed(self, reason: str) -> None:
        self.attempts += 1
        now = time.monotonic()
        if reason != self.reason:
            self.reason = reason
            self.since = time.strftime("%H:%M:%S")
            self._last_log = float("-inf")
        if now - self._last_log >= RETRY_LOG_EVERY_S:
            self._last_log = now
            log.info("%s", self.line())

    def line(self) -> str:
        return f"{STARTUP_WAIT_PREFIX} {self.target}: {self.summary()}"

    def summary(self) -> str:
        if self.reason is None:
            return f"{self.attempts} attempts"
        return f"{self.reason} since {self.since}, attempt {self.attempts}"


@dataclass(frozen=True)
class EngineInfo:
    facts: EngineFacts
    kv_block_size: int
    total_kv_blocks: int
    max_running_requests: int
    engine_name: str


class EngineLink:
    """One H2GrpcChannel to the engine and the stubs that share it. With `keepalive_s` the
    connection PINGs when quiet and is declared dead when a PING goes unanswered for
    `keepalive_timeout_s` (its calls fail with `lab.wire.h2grpc.KEEPALIVE_LOST`)."""

    def __init__(
        self,
        target: str,
        keepalive_s: float = SidecarTiming.keepalive_s,
        keepalive_timeout_s: float = SidecarTiming.keepalive_timeout_s,
    ) -> None:
        self.target = target
        self.channel = H2GrpcChannel(
            target,
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE),
                ("grpc.keepalive_time_ms", max(1, round(keepalive_s * 1000))),
                ("grpc.keepalive_timeout_ms", max(1, round(keepalive_timeout_s * 1000))),
            ],
        )
        self.inference = openengine_pb2_grpc.InferenceStub(self.channel)
        self.control = openengine_pb2_grpc.ControlStub(self.channel)

    async def handshake(
        self, deadline: float, attempt_timeout_s: float, retry_interval_s: float
    ) -> EngineInfo:
        """GetServerInfo (retried until `deadline`, a time.monotonic() value), then GetModelInfo."""
        info = await self._server_info(deadline, attempt_timeout_s, retry_interval_s)
        role = ROLE_NAMES.get(info.engine_role)
        if role is None:
            log.warning(
                "engine at %s reports role %s: serving as aggregated",
                self.target,
                server_pb2.EngineRole.Name(info.engine_role),
            )
            role = "aggregated"
        model_name = info.supported_models[0] if info.supported_models else ""
        remaining = max(0.1, deadline - time.monotonic())
        try:
            model = await self.control.GetModelInfo(
                model_pb2.GetModelInfoRequest(model=model_name),
                timeout=min(CONTROL_TIMEOUT_S, remaining),
            )
        except grpc.aio.AioRpcError as exc:
            raise StartupError(
                f"GetModelInfo on the engine at {self.target} failed: "
                f"{exc.code().name}: {exc.details()}"
            ) from exc
        if not model.HasField("max_context_length") or model.max_context_length == 0:
            raise StartupError(
                f"the engine at {self.target} reports no max_context_length in GetModelInfo: "
                "the sidecar cannot derive max_tokens without a context length; refusing to start"
            )
        served = model.served_model_name or model.model_id or model_name or DEFAULT_MODEL
        cap = info.capacity
        facts = EngineFacts(
            role=role,
            model=served,
            context_length=model.max_context_length,
            max_output_tokens=model.max_output_tokens
            if model.HasField("max_output_tokens")
            else None,
            instance_id=info.instance_id,
        )
        return EngineInfo(
            facts=facts,
            kv_block_size=cap.kv_block_size,
            total_kv_blocks=cap.total_kv_blocks,
            max_running_requests=cap.max_running_requests,
            engine_name=info.engine_name,
        )

    async def _server_info(
        self, deadline: float, attempt_timeout_s: float, retry_interval_s: float
    ) -> server_pb2.ServerInfo:
        """GetServerInfo, retried until `deadline`. Each attempt first checks that the engine's
        port accepts a TCP connection, so that the wait can say why (connection refused, no
        answer) instead of a bare DEADLINE_EXCEEDED, and an engine that is gone costs a connect
        per retry interval rather than a gRPC attempt timeout."""
        wait = StartupWait(self.target)
        while True:
            # The first attempt is made even when the deadline has passed before it (a stalled
            # start on a loaded machine): the error then gives the engine's reason. It may
            # overrun the deadline by one retry interval; later attempts end by the deadline.
            remaining = max(deadline - time.monotonic(), retry_interval_s)
            attempt_s = min(attempt_timeout_s, remaining)
            reason = await tcp_refusal(self.target, attempt_s)
            if reason is None:
                try:
                    return await self.control.GetServerInfo(
                        server_pb2.GetServerInfoRequest(),
                        timeout=attempt_s,
                        wait_for_ready=True,
                    )
                except grpc.aio.AioRpcError as exc:
                    reason = f"GetServerInfo failed: {exc.code().name}"
            wait.failed(reason)
            # No attempt starts within a retry interval of the deadline: one squeezed into what
            # is left (a timer can fire a fraction of a millisecond early) would time out in
            # microseconds and report that as the reason instead of the engine's refusal.
            if time.monotonic() + retry_interval_s >= deadline:
                await asyncio.sleep(max(0.0, deadline - time.monotonic()))
                raise StartupError(
                    f"the engine at {self.target} did not answer GetServerInfo within the "
                    f"start-up deadline ({wait.summary()})"
                )
            await asyncio.sleep(retry_interval_s)

    async def load(self, timeout_s: float) -> server_pb2.LoadInfo:
        return await self.control.GetLoad(server_pb2.GetLoadRequest(), timeout=timeout_s)

    async def abort(self, request_id: str) -> None:
        """Control.Abort{request_id}; failures are logged, never raised."""
        try:
            await self.control.Abort(
                lifecycle_pb2.AbortRequest(request_id=request_id), timeout=CONTROL_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as exc:
            log.warning("Abort(%s) failed: %s: %s", request_id, exc.code().name, exc.details())

    async def close(self) -> None:
        await self.channel.close()
