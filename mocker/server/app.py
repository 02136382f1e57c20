"""Assemble and run the mocker's gRPC server.

One gRPC server on one port serves openengine.v1 Inference + Control, grpc.health.v1 and the
request recorder: lab.wire.h2grpc's batched HTTP/2 server (grpc.aio is no run-time path; it is
the oracle h2grpc is tested against, tests/wire/test_h2grpc.py). The admin (fault-injection)
service runs only when `admin_listen` is given, on an h2grpc server of its own bound there.
Graceful stop (SIGTERM/SIGINT): every health service NOT_SERVING (liveness first), Watch streams
end, in-flight requests get `grace_s` to finish, then the engine loop stops and `serve` returns 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable

from lab.wire import constants as wc
from lab.wire.constants import MAX_GRPC_MESSAGE_BYTES
from lab.wire.h2grpc import H2GrpcServer
from lab.wire.ready import format_ready
from mocker.engine import Scheduler

from . import fastwire
from .admin import Admin
from .config import ServerConfig
from .control import Control
from .health import NOT_SERVING, SERVING, HealthServicer
from .inference import Inference, add_inference
from .pb import admin_pb2_grpc, health_pb2_grpc, openengine_pb2_grpc
from .state import ServerState

log = logging.getLogger("mocker.server")

MAX_MESSAGE_BYTES = MAX_GRPC_MESSAGE_BYTES
#: The real TRT-LLM OpenEngine servicer's channel options (docs/engine-contract.md).
SERVER_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.so_reuseport", 0),
]


class MockerServer:
    """The server and its state; `start()` binds, `run_until_stopped()` serves until stop()."""

    def __init__(self, cfg: ServerConfig) -> None:
        self.cfg = cfg
        self.listen = cfg.settings.listen
        self.admin_listen = admin_listen = cfg.settings.admin_listen
        fastwire.warm()
        self.health = HealthServicer(wc.HEALTH_SERVICES, NOT_SERVING)
        self.state = ServerState(cfg, Scheduler(cfg.engine), self.health)
        self.server = H2GrpcServer(options=SERVER_OPTIONS)
        add_inference(Inference(self.state), self.server)
        openengine_pb2_grpc.add_ControlServicer_to_server(Control(self.state), self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.server.add_generic_rpc_handlers([self.state.recorder.handler()])
        self.admin_server: H2GrpcServer | None = None
        if admin_listen:
            self.admin_server = H2GrpcServer()
            admin_pb2_grpc.add_AdminServicer_to_server(Admin(self.state), self.admin_server)
        self.address = ""
        self.admin_address = ""
        self.failed: Exception | None = None
        self._stop = asyncio.Event()

    async def start(self) -> str:
        """Bind and start; returns the bound "host:port"."""
        host, _, _ = self.listen.rpartition(":")
        port = self.server.add_insecure_port(self.listen)
        if self.admin_server is not None:
            assert self.admin_listen is not None
            admin_host, _, _ = self.admin_listen.rpartition(":")
            admin_port = self.admin_server.add_insecure_port(self.admin_listen)
            await self.admin_server.start()
            self.admin_address = f"{admin_host}:{admin_port}"
        await self.server.start()
        self.address = f"{host}:{port}"
        return self.address

    def stop(self) -> None:
        self._stop.set()

    async def _watchdog(self) -> None:
        loop = asyncio.get_running_loop()
        period = max(0.05, min(1.0, self.cfg.settings.stall_timeout / 4))
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), period)
            self.state.check_stalls(loop.time())

    async def _engine(self) -> None:
        """Run the engine loop; if it dies, fail in-flight requests in-band (INTERNAL), drop
        liveness and stop the server (`failed` is set, `serve` exits 1)."""
        try:
            await self.state.engine.run()
        except Exception as exc:
            log.exception("the engine loop failed")
            self.failed = exc
            self.health.set(wc.HEALTH_LIVENESS, NOT_SERVING)
            self.state.fail_executor(f"the engine loop failed: {exc!r}")
            self._stop.set()

    async def run_until_stopped(self, on_ready: Callable[[str], None] | None = None) -> None:
        async with asyncio.TaskGroup() as tg:
            engine_task = tg.create_task(self._engine(), name="engine-loop")
            tg.create_task(self._watchdog(), name="stall-watchdog")
            self.health.set_all(SERVING)
            if on_ready is not None:
                on_ready(self.address)
            await self._stop.wait()
            log.info("stopping: liveness NOT_SERVING, grace %.1f s", self.cfg.settings.grace)
            self.health.enter_graceful_shutdown()
            await self.server.stop(self.cfg.settings.grace)
            if self.admin_server is not None:
                await self.admin_server.stop(0)
            self.state.engine.stop()
            await engine_task
        st = self.state
        m = st.engine.scheduler.metrics()
        log.info(
            "stopped: streamed %d tokens in %d TokenOutput messages (%.2f per message); "
            "%d passes (%d fast-forwarded, %d slept to), %.1f tokens per pass",
            st.tokens_streamed,
            st.token_messages,
            st.tokens_streamed / max(st.token_messages, 1),
            m.passes,
            st.engine.stats.fast_passes,
            st.engine.stats.sleeps,
            m.tokens_emitted / max(m.passes, 1),
        )


async def serve(cfg: ServerConfig) -> int:
    """Run `mocker serve` until SIGTERM/SIGINT; returns the exit code."""
    server = MockerServer(cfg)
    try:
        address = await server.start()
    except OSError as exc:
        log.error("cannot listen on %s: %s", server.listen, exc)
        return 1
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.stop)

    def ready(addr: str) -> None:
        extra = {"admin": server.admin_address} if server.admin_address else {}
        log.info(format_ready("engine", cfg.instance_id, addr, **extra))

    log.info(
        "role=%s model=%s speedup=%g engine_args=%s",
        cfg.settings.role,
        cfg.settings.model,
        cfg.engine.speedup_ratio,
        cfg.engine.to_json(),
    )
    await server.run_until_stopped(ready)
    if server.failed is not None:
        log.error("exiting 1: the engine failed (instance %s, %s)", cfg.instance_id, address)
        return 1
    return 0
