"""Engine-loss detection against real in-process h2grpc health servers (127.0.0.1:0), watched
over the sidecar's own channel (H2GrpcChannel), as at run time."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from lab.serve.sidecar.liveness import EngineLoss, LoadMonitor, watch_liveness
from lab.wire.h2grpc import H2GrpcChannel, H2GrpcServer

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
LOGGER = "lab.serve.sidecar.liveness"


class ScriptedHealth(health_pb2_grpc.HealthServicer):
    """A Watch that runs a test-supplied coroutine (to end, fail, hang, or abort)."""

    def __init__(self, script: Callable) -> None:
        self.script = script

    async def Watch(self, request, context) -> AsyncIterator:
        async for item in self.script(request, context):
            yield item


async def start_server(servicer=None) -> tuple[H2GrpcServer, H2GrpcChannel]:
    server = H2GrpcServer()
    if servicer is not None:
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = H2GrpcChannel(f"127.0.0.1:{port}")
    return server, channel


async def run_watch(channel, open_timeout_s: float = 5.0) -> tuple[EngineLoss, asyncio.Task]:
    loss = EngineLoss("engine-0-abc")
    task = asyncio.create_task(watch_liveness(channel, loss, open_timeout_s))
    return loss, task


async def resolved_within(loss: EngineLoss, seconds: float) -> str:
    async with asyncio.timeout(seconds):
        return await loss.wait()


async def stop(task: asyncio.Task, server: H2GrpcServer, channel: H2GrpcChannel) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await channel.close()
    await server.stop(0)


async def serving_watch():
    """A health server whose liveness is SERVING, and a watch on it."""
    servicer = health.aio.HealthServicer()
    await servicer.set("liveness", SERVING)
    server, channel = await start_server(servicer)
    loss, task = await run_watch(channel)
    return servicer, server, channel, loss, task


async def test_not_serving_resolves_while_serving_stays_pending() -> None:
    servicer, server, channel, loss, task = await serving_watch()
    try:
        await asyncio.sleep(0.3)
        assert not loss.resolved
        # Readiness is not watched: "inference" going NOT_SERVING changes nothing.
        await servicer.set("inference", NOT_SERVING)
        await servicer.set("liveness", SERVING)
        await asyncio.sleep(0.3)
        assert not loss.resolved
        await servicer.set("liveness", NOT_SERVING)
        reason = await resolved_within(loss, 5)
        assert reason == "liveness status NOT_SERVING"
        assert loss.message() == "engine lost: liveness status NOT_SERVING (instance engine-0-abc)"
    finally:
        await stop(task, server, channel)


async def test_clean_end_of_the_watch_resolves() -> None:
    sent, release = asyncio.Event(), asyncio.Event()

    async def script(request, context):
        assert request.service == "liveness"
        yield health_pb2.HealthCheckResponse(status=SERVING)
        sent.set()
        await release.wait()  # then a graceful stop: the stream ends OK

    server, channel = await start_server(ScriptedHealth(script))
    loss, task = await run_watch(channel)
    try:
        async with asyncio.timeout(5):
            await sent.wait()
        # The stream is held open until `release`: a SERVING status alone resolves nothing.
        # (The pause lets the watch read the status; its length only makes the check sharper.)
        await asyncio.sleep(0.1)
        assert not loss.resolved
        release.set()
        assert "watch ended" in await resolved_within(loss, 5)
    finally:
        await stop(task, server, channel)


async def test_watch_error_resolves() -> None:
    async def script(request, context):
        yield health_pb2.HealthCheckResponse(status=SERVING)
        await asyncio.sleep(0.2)
        await context.abort(grpc.StatusCode.INTERNAL, "executor exploded")

    server, channel = await start_server(ScriptedHealth(script))
    loss, task = await run_watch(channel)
    try:
        reason = await resolved_within(loss, 5)
        assert reason.startswith("liveness watch failed: INTERNAL") and "exploded" in reason
    finally:
        await stop(task, server, channel)


async def test_dropped_connection_resolves() -> None:
    _servicer, server, channel, loss, task = await serving_watch()
    try:
        await asyncio.sleep(0.3)
        assert not loss.resolved
        await server.stop(0)  # the engine process goes away
        reason = await resolved_within(loss, 5)
        assert reason.startswith("liveness watch failed")
    finally:
        await stop(task, server, channel)


async def test_watch_that_never_opens_resolves_within_the_timeout() -> None:
    async def script(request, context):
        await asyncio.sleep(60)  # never sends the first status
        yield health_pb2.HealthCheckResponse(status=SERVING)

    server, channel = await start_server(ScriptedHealth(script))
    loop = asyncio.get_running_loop()
    started = loop.time()
    loss, task = await run_watch(channel, open_timeout_s=0.5)
    try:
        reason = await resolved_within(loss, 5)
        assert reason == "liveness watch did not open within 0.5 s"
        assert 0.4 < loop.time() - started < 3
    finally:
        await stop(task, server, channel)


@pytest.mark.parametrize("kind", ["not_found", "unimplemented"])
async def test_no_health_service_stays_pending_with_one_warning(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def script(request, context):
        await context.abort(grpc.StatusCode.NOT_FOUND, "no such service")
        yield  # pragma: no cover

    servicer = ScriptedHealth(script) if kind == "not_found" else None  # None: no Health at all
    server, channel = await start_server(servicer)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    loss, task = await run_watch(channel)
    try:
        async with asyncio.timeout(5):
            await task  # returns: no watch
        await asyncio.sleep(0.2)
        assert not loss.resolved
        warnings = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
        assert len(warnings) == 1
        code = "NOT_FOUND" if kind == "not_found" else "UNIMPLEMENTED"
        assert code in warnings[0].getMessage()
        assert "not watched" in warnings[0].getMessage()
    finally:
        await stop(task, server, channel)


async def test_first_service_unknown_resolves() -> None:
    servicer = health.aio.HealthServicer()  # "liveness" never registered
    server, channel = await start_server(servicer)
    loss, task = await run_watch(channel)
    try:
        assert await resolved_within(loss, 5) == "liveness status SERVICE_UNKNOWN"
    finally:
        await stop(task, server, channel)


async def test_stale_load_resolves_only_while_requests_are_active() -> None:
    loss = EngineLoss("engine-0-abc")
    mon = LoadMonitor(loss, "engine-0-abc", stale_s=30, now=0.0)
    mon.sample("engine-0-abc", 100, now=1.0)
    mon.check(active_requests=0, now=100.0)  # idle for long: fine
    assert not loss.resolved
    mon.sample("engine-0-abc", 100, now=101.0)  # the timestamp did not move ...
    mon.check(active_requests=3, now=120.0)  # ... busy for 20 s: not yet
    assert not loss.resolved
    mon.sample("engine-0-abc", 200, now=125.0)  # a fresh sample resets the clock
    mon.check(active_requests=3, now=150.0)
    assert not loss.resolved
    mon.check(active_requests=3, now=156.0)  # 31 s without a fresh sample while busy
    assert loss.resolved
    assert loss.reason == "no fresh load sample for 31 s while 3 requests are active"
    assert loss.message().startswith("engine lost: no fresh load sample")


async def test_new_instance_id_resolves_through_the_same_path() -> None:
    loss = EngineLoss("engine-0-abc")
    mon = LoadMonitor(loss, "engine-0-abc", stale_s=30, now=0.0)
    mon.sample("engine-0-abc", 1, now=1.0)
    assert not loss.resolved
    mon.sample("engine-0-def", 2, now=2.0)
    assert loss.reason == "engine instance id changed: engine-0-abc -> engine-0-def"
    loss.report("liveness status NOT_SERVING")  # a later reason does not replace the first
    assert loss.reason == "engine instance id changed: engine-0-abc -> engine-0-def"
    assert await loss.wait() == loss.reason
