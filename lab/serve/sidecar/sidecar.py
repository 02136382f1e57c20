"""The sidecar process: engine handshake, request plane, registration, heartbeat, engine-loss
watch, and the two ways out (SIGTERM drain -> exit 0, engine lost -> exit 1)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Coroutine
from typing import Any

import grpc
from google.protobuf import json_format

from lab.serve.discovery import Registry, WorkerRecord, open_registry
from lab.serve.request_plane import RequestPlaneServer, StreamSink, error_end
from lab.serve.sidecar.convert import (
    EngineFacts,
    ProtocolError,
    RequestError,
    ResponseConverter,
    build_generate_request,
    error_payload,
    rpc_error,
)
from lab.serve.sidecar.engine import EngineInfo, EngineLink, StartupError
from lab.serve.sidecar.liveness import EngineLoss, LoadMonitor, watch_liveness
from lab.serve.sidecar.progress import MessageCounter, StallCheck, probe_engine
from lab.shared.settings import SocketSettings
from lab.shared.sidecar_settings import SidecarSettings
from lab.wire.address import split_address
from lab.wire.h2grpc.client import UnaryStreamCall
from lab.wire.ready import format_ready

log = logging.getLogger("lab.sidecar")

NO_TERMINAL = "Generate ended before a terminal response"
# Not published: per-rank detail, and the sample timestamp (it changes on every poll, so it
# would make every heartbeat look like a change to discovery watchers).
_SKIP_LOAD_FIELDS = frozenset({"ranks", "attributes", "timestamp_unix_nanos"})


def load_dict(load) -> dict:
    """LoadInfo -> plain JSON numbers (json_format would turn uint64 into strings)."""
    out = {fd.name: value for fd, value in load.ListFields() if fd.name not in _SKIP_LOAD_FIELDS}
    if load.HasField("attributes"):
        out["attributes"] = json_format.MessageToDict(load.attributes)
    return out


async def _first_of(*waits: Coroutine[Any, Any, object]) -> None:
    """Until the first of `waits` finishes; the others are cancelled and awaited."""
    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(w) for w in waits]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()


class _Active:
    """One in-flight request: what a forced drain needs to end it."""

    __slots__ = ("call", "sink")

    def __init__(self, sink: StreamSink) -> None:
        self.sink = sink
        self.call: UnaryStreamCall | None = None


class Sidecar:
    def __init__(self, settings: SidecarSettings) -> None:
        self.settings = settings
        self.worker_id = settings.worker_id
        self.link: EngineLink | None = None
        self.facts: EngineFacts | None = None
        self.admitting = True
        self._active: set[_Active] = set()
        self._idle: asyncio.Event | None = None
        self._stop: asyncio.Event | None = None
        # a second SIGTERM/SIGINT: end the grace period and the drain at once
        self._stop_now: asyncio.Event | None = None
        self.loss: EngineLoss | None = None
        self.received = MessageCounter()
        self.stalled: str | None = None  # why the worker is out of rotation (engine stalled)
        self._back: asyncio.Event | None = None  # set when an out-of-rotation spell ends
        self._registry_lock = asyncio.Lock()

    # -- request path ---------------------------------------------------------------------------

    async def handle(self, request: dict, sink: StreamSink) -> None:
        """The request-plane handler: one Generate per stream."""
        wid = self.worker_id
        if not self.admitting:
            sink.end(error_end("unavailable", f"worker {wid} is draining", 503, wid))
            return
        if self.stalled is not None:
            sink.end(error_end("unavailable", f"engine stalled: {self.stalled}", 503, wid))
            return
        if sink.cancelled.is_set():
            sink.end(error_end("cancelled", "cancelled before it started", 499, wid))
            return
        facts = self.facts
        assert facts is not None and self.link is not None
        try:
            greq, plan = build_generate_request(request, facts)
        except RequestError as exc:
            sink.end(error_end("invalid_request", str(exc), 400, wid))
            return
        conv = ResponseConverter(plan, facts.role, wid)
        active = _Active(sink)
        self._active.add(active)
        assert self._idle is not None
        self._idle.clear()
        call = self.link.inference.Generate(greq)
        active.call = call
        sink.on_cancel = call.cancel
        received = self.received
        try:
            async for msg in call:
                received.messages += 1
                kind = msg.WhichOneof("event")
                if kind == "token":
                    chunk = conv.token(msg.token)
                    if chunk is not None:
                        sink.chunk(chunk)
                    continue
                held, end = conv.terminal(msg, kind)
                if held is not None:
                    sink.chunk(held)
                sink.end(end)
                return
            sink.end(conv.end(error=error_payload("protocol", NO_TERMINAL, 502)))
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the sidecar is stopping; the server sends the END
            await self._cancelled(sink, conv, plan.request_id)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.CANCELLED and sink.cancelled.is_set():
                await self._cancelled(sink, conv, plan.request_id)
            else:
                sink.end(conv.end(error=rpc_error(exc.code(), exc.details())))
        except ProtocolError as exc:
            call.cancel()
            sink.end(conv.end(error=error_payload("protocol", str(exc), 502)))
        finally:
            sink.on_cancel = None
            self._active.discard(active)
            if not self._active:
                self._idle.set()

    async def _cancelled(self, sink: StreamSink, conv: ResponseConverter, request_id: str) -> None:
        if sink.ended:
            return  # ended by a forced drain
        sink.end(conv.cancelled_end())
        assert self.link is not None
        await self.link.abort(request_id)

    def _cut_active(self, message: str) -> None:
        """End every in-flight request with an error END (retryable: the frontend may migrate
        it) and cancel its Generate."""
        for active in list(self._active):
            active.sink.end(error_end("unavailable", message, 503, self.worker_id))
            if active.call is not None:
                active.call.cancel()

    async def _wait_idle(self, timeout_s: float) -> bool:
        """Until nothing is in flight (True), or False when `timeout_s` passes or a second
        signal says stop now."""
        assert self._idle is not None and self._stop_now is not None
        if not self._active:
            return True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await _first_of(self._idle.wait(), self._stop_now.wait())
        return self._idle.is_set()

    # -- background loops -----------------------------------------------------------------------

    async def _heartbeat(
        self, registry: Registry, record: WorkerRecord, monitor: LoadMonitor, stall: StallCheck
    ) -> None:
        """Poll GetLoad, publish it in the record (the heartbeat), feed the stale-load check."""
        assert self.link is not None
        cfg = self.settings
        last_warn = float("-inf")
        while True:
            await asyncio.sleep(cfg.heartbeat)
            stall.load_asked(time.monotonic())
            try:
                load = await self.link.load(timeout_s=max(1.0, cfg.heartbeat))
                now = time.monotonic()
                stamp = load.timestamp_unix_nanos if load.HasField("timestamp_unix_nanos") else None
                monitor.sample(load.instance_id, stamp, now)
                stall.load_sample(stamp, now)
                record.load = {**load_dict(load), "in_flight": len(self._active)}
            except grpc.aio.AioRpcError as exc:
                now = time.monotonic()
                if now - last_warn >= 30.0:
                    last_warn = now
                    log.warning("GetLoad failed: %s: %s", exc.code().name, exc.details())
            monitor.check(len(self._active), now)
            async with self._registry_lock:
                if self.stalled is not None:
                    continue  # withdrawn: the record comes back when the engine does
                try:
                    await registry.refresh(record)
                except OSError as exc:
                    log.warning("discovery refresh failed: %s", exc)

    async def _stall_watch(
        self, registry: Registry, record: WorkerRecord, stall: StallCheck
    ) -> None:
        """Withdraw when the engine stops making progress; register again once it serves."""
        tick = min(0.25, self.settings.stall / 4)
        while True:
            await asyncio.sleep(tick)
            reason = stall.check(self.received.messages, len(self._active), time.monotonic())
            if reason is not None:
                await self._out_of_rotation(registry, record, stall, reason)

    async def _liveness(
        self, registry: Registry, record: WorkerRecord, stall: StallCheck, loss: EngineLoss
    ) -> None:
        """The liveness watch, again after each keepalive timeout: a connection whose PING went
        unanswered (a frozen engine) takes the worker out of rotation like a stall, and the
        watch follows the new connection once the engine serves."""
        assert self.link is not None
        while True:
            frozen = await watch_liveness(
                self.link.channel, loss, self.settings.connect_attempt_timeout
            )
            if frozen is None:
                return
            await self._out_of_rotation(registry, record, stall, frozen)

    async def _out_of_rotation(
        self, registry: Registry, record: WorkerRecord, stall: StallCheck, reason: str
    ) -> None:
        """Withdraw, end the in-flight requests retryable, probe until the engine serves,
        register again. While another path has the worker out already, wait for its return."""
        if self._back is not None:
            await self._back.wait()
            return
        self._back = asyncio.Event()
        try:
            await self._withdrawn_until_serving(registry, record, stall, reason)
        finally:
            self._back.set()
            self._back = None

    async def _withdrawn_until_serving(
        self, registry: Registry, record: WorkerRecord, stall: StallCheck, reason: str
    ) -> None:
        """The out-of-rotation spell itself (`_out_of_rotation`)."""
        since = time.monotonic()
        async with self._registry_lock:
            self.stalled = reason
            try:
                await registry.withdraw(self.worker_id)
            except OSError as exc:
                log.error("discovery withdraw failed (the record will expire): %s", exc)
        log.error(
            "engine stalled: %s; withdrawn from discovery, %d in-flight requests end "
            "retryable; probing the engine",
            reason,
            len(self._active),
        )
        self._cut_active(f"engine stalled: {reason}")
        await self._wait_serving(float("inf"))
        while True:
            async with self._registry_lock:
                try:
                    await registry.register(record)
                except OSError as exc:
                    log.error("discovery register failed (retrying in 1 s): %s", exc)
                else:
                    self.stalled = None
                    break
            await asyncio.sleep(1.0)
        stall.reset(time.monotonic())
        log.info(
            "engine serves again after %.1f s out of rotation: registered again",
            time.monotonic() - since,
        )

    async def _wait_serving(self, deadline: float) -> str | None:
        """Probe the engine until it shows it can serve (None) or `deadline` (time.monotonic())
        passes (the last reason)."""
        assert self.link is not None and self.facts is not None
        attempt = 0
        last_log = float("-inf")
        while True:
            attempt += 1
            bound = min(self.settings.probe_timeout, max(0.1, deadline - time.monotonic()))
            reason = await probe_engine(self.link, self.facts, bound, attempt)
            if reason is None:
                return None
            now = time.monotonic()
            if now >= deadline:
                return reason
            if now - last_log >= 30.0:
                last_log = now
                log.warning("engine %s cannot serve yet: %s", self.settings.engine, reason)

    # -- lifecycle ------------------------------------------------------------------------------

    async def run(self) -> int:
        """Returns the exit code."""
        loop = asyncio.get_running_loop()
        cfg = self.settings
        self._stop = asyncio.Event()
        self._stop_now = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        main = asyncio.current_task()
        assert main is not None
        starting = True

        def on_signal(signame: str) -> None:
            assert self._stop is not None and self._stop_now is not None
            if self._stop.is_set():
                log.info("%s received again: no grace period, no drain", signame)
                self._stop_now.set()
                return
            log.info("%s received", signame)
            if starting:
                main.cancel()
            self._stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig.name)

        registry = open_registry(cfg.discovery, ttl_s=cfg.ttl)
        self.link = EngineLink(cfg.engine, cfg.keepalive, cfg.keepalive_timeout)
        server: RequestPlaneServer | None = None
        try:
            try:
                deadline = time.monotonic() + cfg.startup_deadline
                info = await self.link.handshake(
                    deadline, cfg.connect_attempt_timeout, cfg.retry_interval
                )
            except StartupError as exc:
                log.error("start-up failed: %s", exc)
                return 1
            except asyncio.CancelledError:
                log.info("stopped before the engine was ready")
                return 0
            self.facts = info.facts
            try:
                reason = await self._wait_serving(deadline)
            except asyncio.CancelledError:
                log.info("stopped before the engine was ready")
                return 0
            if reason is not None:
                log.error("start-up failed: the engine cannot serve: %s", reason)
                return 1
            starting = False
            self.loss = EngineLoss(info.facts.instance_id)
            server = RequestPlaneServer(
                self.handle, SocketSettings(server_nodelay=cfg.server_nodelay)
            )
            address = await server.start(*split_address(cfg.listen, allow_port_zero=True))
            record = self._record(info, address)
            try:
                record.load = {**load_dict(await self.link.load(5.0)), "in_flight": 0}
            except grpc.aio.AioRpcError:
                pass
            await registry.register(record)
            log.info(
                "serving engine %s (%s, role %s, instance %s, context %d) as %s",
                cfg.engine,
                info.engine_name or "?",
                info.facts.role,
                info.facts.instance_id,
                info.facts.context_length,
                self.worker_id,
            )
            log.info(format_ready("sidecar", self.worker_id, address))
            return await self._serve(registry, record, server)
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            if server is not None:
                await server.close()
            await self.link.close()
            await registry.close()

    async def _grace(self, server: RequestPlaneServer, seconds: float) -> None:
        """The serving grace after a withdrawal, for frontends that have not seen it yet.

        Where frontends have connected, it ends as soon as none is connected: a frontend
        routes over its connections, so once every one has closed no request is coming (at a
        whole stack's teardown its frontend stops with the sidecars, often before this runs,
        and the grace cost every launched stack 5 s). A frontend that has read the record but
        never connected is the one it misses: its first request finds no listener and is
        retried on another worker. Where no frontend ever connected, one may still come: the
        whole grace, unless a second signal says stop now (the launcher sends one once its
        stack's frontend has exited)."""
        assert self._stop_now is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                if not server.ever_connected:
                    await self._stop_now.wait()
                    return
                await _first_of(server.wait_unconnected(), self._stop_now.wait())
        if server.ever_connected and not server.connected:
            log.info("no frontend connected: the grace period ends early")

    def _record(self, info: EngineInfo, address: str) -> WorkerRecord:
        facts = info.facts
        return WorkerRecord(
            worker_id=self.worker_id,
            role=facts.role,
            address=address,
            model=facts.model,
            context_length=facts.context_length,
            kv_block_size=info.kv_block_size,
            total_kv_blocks=info.total_kv_blocks,
            max_running_requests=info.max_running_requests,
            instance_id=facts.instance_id,
            pid=os.getpid(),
        )

    async def _serve(self, registry: Registry, record: WorkerRecord,
                     server: RequestPlaneServer) -> int:
        cfg = self.settings
        loss = self.loss
        assert loss is not None and self._stop is not None and self.link is not None
        assert self._stop_now is not None
        monitor = LoadMonitor(loss, record.instance_id, cfg.stale_load, time.monotonic())
        stall = StallCheck(cfg.stall, time.monotonic())
        async with asyncio.TaskGroup() as tg:
            heartbeat = tg.create_task(self._heartbeat(registry, record, monitor, stall))
            stall_watch = tg.create_task(self._stall_watch(registry, record, stall))
            watch = tg.create_task(self._liveness(registry, record, stall, loss))
            stop_wait = tg.create_task(self._stop.wait())
            loss_wait = tg.create_task(loss.wait())
            await asyncio.wait({stop_wait, loss_wait}, return_when=asyncio.FIRST_COMPLETED)
            lost = loss.resolved and not self._stop.is_set()
            # Withdraw first (stop the heartbeat and the stall watch so neither can re-publish
            # the record).
            heartbeat.cancel()
            stall_watch.cancel()
            try:
                await registry.withdraw(self.worker_id)
            except OSError as exc:
                # The drain must still happen: the record expires on its own (TTL / lease).
                log.error("discovery withdraw failed (the record will expire): %s", exc)
            if lost:
                exit_code = 1
                log.error(loss.message())
                log.info("withdrawn from discovery; draining for up to %g s", cfg.grace_period)
                self.admitting = False
                if not await self._wait_idle(cfg.grace_period):
                    self._cut_active(f"{loss.message()}; the request could not finish")
            else:
                exit_code = 0
                log.info(
                    "withdrawn from discovery; serving for the %g s grace period",
                    cfg.grace_period,
                )
                await self._grace(server, cfg.grace_period)
                self.admitting = False
                log.info("refusing new requests; waiting for %d in flight", len(self._active))
                if not await self._wait_idle(cfg.inflight_timeout):
                    why = "stopped now" if self._stop_now.is_set() else "stopped (drain timeout)"
                    self._cut_active(f"worker {self.worker_id} {why}")
                if loss.resolved:
                    log.warning("%s (during the drain; exit code stays 0)", loss.message())
            for task in (watch, stop_wait, loss_wait):
                task.cancel()
        await asyncio.sleep(0)  # let the cut requests' handlers send their ENDs
        log.info("exiting with code %d", exit_code)
        return exit_code
