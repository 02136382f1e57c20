"""The sidecar in-process against a scripted in-process engine (real gRPC and request-plane
sockets on 127.0.0.1): Abort on cancel, stream-shape errors, status mapping, the loss and drain
paths."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from lab.serve.discovery import open_registry
from lab.serve.request_plane import FrameType, RequestPlaneClient
from lab.serve.sidecar.sidecar import Sidecar
from lab.shared.sidecar_settings import SidecarSettings
from lab.wire.gen.openengine.v1 import (
    error_pb2,
    generation_pb2,
    lifecycle_pb2,
    model_pb2,
    openengine_pb2_grpc,
    server_pb2,
)
from tests.waiting import wait_for

CHUNK, END = int(FrameType.CHUNK), int(FrameType.END)


def tok(i: int) -> generation_pb2.GenerateResponse:
    return generation_pb2.GenerateResponse(
        token=generation_pb2.TokenOutput(
            output_index=0, tokens=[generation_pb2.TokenInfo(token_id=i)]
        )
    )


def fin(reason: int = 2) -> generation_pb2.GenerateResponse:
    return generation_pb2.GenerateResponse(
        finished=generation_pb2.GenerationFinished(output_index=0, reason=reason)
    )


async def script_ok(request, context) -> AsyncIterator:
    for i in range(request.stopping.max_tokens):
        yield tok(100 + i)
    yield fin()


class FakeEngine(openengine_pb2_grpc.InferenceServicer, openengine_pb2_grpc.ControlServicer):
    def __init__(self) -> None:
        self.script: Callable = script_ok
        self.context_length: int | None = 1000
        self.instance_id = "fake-engine-1"
        self.load_instance_id = "fake-engine-1"
        self.load_stamp: int | None = None  # None: advances on every call
        self.aborts: list[str] = []
        self.generate_cancelled = asyncio.Event()
        self.requests: list[generation_pb2.GenerateRequest] = []

    async def Generate(self, request, context):
        if request.request_id.startswith("canary-"):  # the sidecar's readiness probe
            async for msg in script_ok(request, context):
                yield msg
            return
        self.requests.append(request)
        try:
            async for msg in self.script(request, context):
                yield msg
        except asyncio.CancelledError:
            self.generate_cancelled.set()
            raise

    async def GetServerInfo(self, request, context):
        return server_pb2.ServerInfo(
            engine_name="fake",
            engine_role=server_pb2.ENGINE_ROLE_AGGREGATED,
            instance_id=self.instance_id,
            supported_models=["fake-model"],
            capacity=server_pb2.DeploymentCapacity(kv_block_size=32, total_kv_blocks=100),
        )

    async def GetModelInfo(self, request, context):
        info = model_pb2.ModelInfo(model_id="fake-model", served_model_name="fake-model")
        if self.context_length is not None:
            info.max_context_length = self.context_length
        return info

    async def GetLoad(self, request, context):
        stamp = self.load_stamp if self.load_stamp is not None else time.time_ns()
        return server_pb2.LoadInfo(
            instance_id=self.load_instance_id, timestamp_unix_nanos=stamp, running_requests=0
        )

    async def Abort(self, request, context):
        self.aborts.append(request.request_id)
        return lifecycle_pb2.AbortResponse(status=lifecycle_pb2.ABORT_STATUS_ABORTED)


@asynccontextmanager
async def stack(tmp_path: Path, engine: FakeEngine, **overrides) -> AsyncIterator:
    server = grpc.aio.server()
    openengine_pb2_grpc.add_InferenceServicer_to_server(engine, server)
    openengine_pb2_grpc.add_ControlServicer_to_server(engine, server)
    healths = health.aio.HealthServicer()
    await healths.set("liveness", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(healths, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    settings = {
        "engine": f"127.0.0.1:{port}",
        "listen": "127.0.0.1:0",
        "discovery": f"file:{tmp_path / 'disc'}",
        "worker_id": "sidecar-t",
        "grace_period": 0.3,
        "heartbeat": 0.1,
        "ttl": 5,
        "startup_deadline": 5,
        "connect_attempt_timeout": 2,
        **overrides,
    }
    sidecar = Sidecar(SidecarSettings(**settings))
    task = asyncio.create_task(sidecar.run())
    registry = open_registry(settings["discovery"])
    client: RequestPlaneClient | None = None
    try:
        async with asyncio.timeout(10):
            while not (records := await registry.list()) and not task.done():
                await asyncio.sleep(0.02)
        if records:
            client = RequestPlaneClient(records[0].address)
        yield sidecar, task, client, registry, healths
    finally:
        if not task.done() and sidecar._stop is not None:
            sidecar._stop.set()
        async with asyncio.timeout(15):
            await asyncio.gather(task, return_exceptions=True)
        if client is not None:
            await client.close()
        await server.stop(0)


def request(rid: str = "r-1", max_tokens: int = 3) -> dict:
    return {"request_id": rid, "model": "m", "token_ids": [1, 2, 3], "max_tokens": max_tokens}


async def collect(stream) -> tuple[list[int], dict]:
    tokens: list[int] = []
    async with asyncio.timeout(10):
        async for ftype, payload in stream:
            if ftype == CHUNK:
                tokens += payload["t"]
            else:
                return tokens, payload
    raise AssertionError("no END")


async def test_serves_and_registers(tmp_path: Path) -> None:
    engine = FakeEngine()
    async with stack(tmp_path, engine) as (_, _, client, registry, _):
        (record,) = await registry.list()
        assert record.role == "aggregated" and record.model == "fake-model"
        assert record.context_length == 1000 and record.instance_id == "fake-engine-1"
        assert record.kv_block_size == 32 and record.total_kv_blocks == 100
        tokens, end = await collect(await client.open_stream(request(max_tokens=4)))
        assert tokens == [100, 101, 102, 103]
        assert end["finish"] == "length" and end["worker_id"] == "sidecar-t"
        assert end["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "cached_tokens": 0}
        # The first heartbeat publishes the engine's load (heartbeat every 0.1 s here).
        async def published() -> bool:
            (record,) = await registry.list()
            return "in_flight" in record.load

        await wait_for(published, 10, "the heartbeat's load sample")
        (record,) = await registry.list()
        assert record.load["instance_id"] == "fake-engine-1"


async def slow_forever(request, context):
    i = 0
    while True:
        yield tok(i)
        i += 1
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("how", ["cancel_frame", "connection_drop"])
async def test_cancel_aborts_the_engine_request(tmp_path: Path, how: str) -> None:
    engine = FakeEngine()
    engine.script = slow_forever
    async with stack(tmp_path, engine) as (_, _, client, _, _):
        stream = await client.open_stream(request("r-cancel"))
        async with asyncio.timeout(5):
            ftype, _ = await anext(stream)
        assert ftype == CHUNK
        if how == "cancel_frame":
            await stream.cancel()
            _tokens, end = await collect(stream)
            assert end["finish"] == "cancelled" and end["error"] is None
            assert end["usage"]["completion_tokens"] >= 1
        else:
            await client.close()
        async with asyncio.timeout(5):
            while engine.aborts != ["r-cancel"]:
                await asyncio.sleep(0.02)
            await engine.generate_cancelled.wait()


async def test_stream_without_terminal_is_a_protocol_error(tmp_path: Path) -> None:
    async def no_terminal(request, context):
        yield tok(1)

    engine = FakeEngine()
    engine.script = no_terminal
    async with stack(tmp_path, engine) as (_, _, client, _, _):
        tokens, end = await collect(await client.open_stream(request()))
        assert tokens == [1]
        assert end["error"]["kind"] == "protocol"
        assert end["error"]["message"] == "Generate ended before a terminal response"


@pytest.mark.parametrize(
    ("status", "kind", "http"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, "invalid_request", 400),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "retryable", 503),
        (grpc.StatusCode.INTERNAL, "engine_error", 500),
    ],
)
async def test_grpc_status_errors_are_mapped(
    tmp_path: Path, status: grpc.StatusCode, kind: str, http: int
) -> None:
    async def refuse(request, context):
        await context.abort(status, "nope")
        yield  # pragma: no cover

    engine = FakeEngine()
    engine.script = refuse
    async with stack(tmp_path, engine) as (_, _, client, _, _):
        _, end = await collect(await client.open_stream(request()))
        assert end["error"]["kind"] == kind and end["error"]["status"] == http
        assert "nope" in end["error"]["message"]


async def test_in_band_engine_error(tmp_path: Path) -> None:
    async def overloaded(request, context):
        yield tok(1)
        yield generation_pb2.GenerateResponse(
            error=error_pb2.EngineError(
                code=error_pb2.ERROR_CODE_OVERLOADED, message="stalled", retryable=True
            )
        )

    engine = FakeEngine()
    engine.script = overloaded
    async with stack(tmp_path, engine) as (_, _, client, _, _):
        _, end = await collect(await client.open_stream(request()))
        assert end["error"]["kind"] == "engine_error"  # OVERLOADED is not migratable


async def test_invalid_request_never_reaches_the_engine(tmp_path: Path) -> None:
    engine = FakeEngine()
    async with stack(tmp_path, engine) as (_, _, client, _, _):
        _, end = await collect(await client.open_stream({**request(), "token_ids": []}))
        assert (
            end["error"]["kind"] == "invalid_request" and "'token_ids'" in end["error"]["message"]
        )
        assert end["error"]["status"] == 400
        assert engine.requests == []


async def test_missing_context_length_is_a_startup_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = FakeEngine()
    engine.context_length = None
    caplog.set_level(logging.ERROR)
    async with stack(tmp_path, engine) as (_, task, client, registry, _):
        async with asyncio.timeout(10):
            assert await task == 1
        assert client is None and await registry.list() == []
    assert "no max_context_length" in caplog.text


async def test_unreachable_engine_fails_at_the_startup_deadline(tmp_path: Path) -> None:
    sidecar = Sidecar(
        SidecarSettings(
            engine="127.0.0.1:1",
            discovery=f"file:{tmp_path}",
            worker_id="s",
            startup_deadline=0.8,
            connect_attempt_timeout=0.3,
            retry_interval=0.1,
        )
    )
    started = time.monotonic()
    async with asyncio.timeout(10):
        assert await sidecar.run() == 1
    assert 0.7 < time.monotonic() - started < 5


@pytest.mark.parametrize("reason", ["instance_id", "stale_load", "not_serving"])
async def test_engine_loss_withdraws_cuts_and_exits_1(
    tmp_path: Path, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    engine = FakeEngine()
    engine.script = slow_forever
    caplog.set_level(logging.INFO)
    async with stack(tmp_path, engine, stale_load=0.5, grace_period=0.5) as (
        _sidecar,
        task,
        client,
        registry,
        healths,
    ):
        stream = await client.open_stream(request("r-long"))
        await anext(stream)
        if reason == "instance_id":
            engine.load_instance_id = "fake-engine-2"
        elif reason == "stale_load":
            engine.load_stamp = 12345  # GetLoad answers, but the sample never moves
        else:
            await healths.set("liveness", health_pb2.HealthCheckResponse.NOT_SERVING)
        # Withdrawn while the sidecar still runs (draining the in-flight request) ...
        async with asyncio.timeout(10):
            while await registry.list():
                await asyncio.sleep(0.02)
        assert not task.done()
        # ... new requests are refused, the unfinished one ends with a clear error ...
        _, refused = await collect(await client.open_stream(request("r-new")))
        assert refused["error"]["kind"] == "unavailable"
        _, end = await collect(stream)
        assert end["error"]["kind"] == "unavailable"
        assert "engine lost" in end["error"]["message"]
        # ... and the exit code is 1.
        async with asyncio.timeout(10):
            assert await task == 1
    expected = {
        "instance_id": "engine lost: engine instance id changed: fake-engine-1 -> fake-engine-2",
        "stale_load": "engine lost: no fresh load sample for",
        "not_serving": "engine lost: liveness status NOT_SERVING (instance fake-engine-1)",
    }[reason]
    lost = [r for r in caplog.records if "engine lost" in r.getMessage()]
    assert lost and lost[0].levelno == logging.ERROR and expected in lost[0].getMessage()


async def slowish(request, context):
    """max_tokens tokens, 50 ms apart (longer on a loaded machine, never shorter)."""
    for i in range(request.stopping.max_tokens):
        yield tok(i)
        await asyncio.sleep(0.05)
    yield fin()


async def test_sigterm_drain_serves_during_grace_then_refuses_and_exits_0(tmp_path: Path) -> None:
    engine = FakeEngine()
    engine.script = slowish
    # The grace period is long enough for r-grace on a loaded machine; r-long (>= 2.5 s: its
    # sleeps only get longer under load) is still in flight when the grace period ends.
    async with stack(tmp_path, engine, grace_period=1.5) as (
        sidecar,
        task,
        client,
        registry,
        healths,
    ):
        long_stream = await client.open_stream(request("r-long", max_tokens=50))
        await anext(long_stream)
        sidecar._stop.set()  # what the SIGTERM handler does
        async with asyncio.timeout(5):
            while await registry.list():
                await asyncio.sleep(0.02)
        # During the grace period: still served.
        tokens, end = await collect(await client.open_stream(request("r-grace", max_tokens=2)))
        assert end["error"] is None and len(tokens) == 2
        # A later engine loss does not change the exit code.
        await healths.set("liveness", health_pb2.HealthCheckResponse.NOT_SERVING)
        await wait_for(lambda: not sidecar.admitting, 10, "the end of the grace period")
        _, refused = await collect(await client.open_stream(request("r-late")))
        assert (
            refused["error"]["kind"] == "unavailable" and "draining" in refused["error"]["message"]
        )
        tokens, end = await collect(long_stream)  # in-flight ones finish
        assert end["error"] is None and len(tokens) == 49
        async with asyncio.timeout(10):
            assert await task == 0


async def test_a_failing_withdraw_does_not_skip_the_drain(
    tmp_path: Path, monkeypatch, caplog
) -> None:
    """Discovery down at shutdown (e.g. etcd gone): log it, still drain in-flight work, exit 0."""
    from lab.serve.discovery.file_store import FileRegistry

    async def broken_withdraw(self, worker_id: str) -> None:
        raise OSError("discovery store unreachable")

    engine = FakeEngine()
    engine.script = slowish
    async with stack(tmp_path, engine, grace_period=0.3) as (sidecar, task, client, _, _):
        monkeypatch.setattr(FileRegistry, "withdraw", broken_withdraw)
        long_stream = await client.open_stream(request("r-long", max_tokens=10))
        await anext(long_stream)
        sidecar._stop.set()  # what the SIGTERM handler does
        tokens, end = await collect(long_stream)
        assert end["error"] is None and len(tokens) == 9
        async with asyncio.timeout(10):
            assert await task == 0
    assert any("withdraw failed" in r.getMessage() for r in caplog.records)
