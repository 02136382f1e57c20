"""Real processes: mocker engines (speedup 0 unless a test needs slow tokens) and `lab sidecar`,
driven through the request plane with RequestPlaneClient."""

from __future__ import annotations

import asyncio
import re
import signal
import time
from pathlib import Path

import grpc
import psutil
import pytest

from lab.serve.discovery.file_store import FileRegistry
from lab.serve.request_plane import FrameType, RequestPlaneClient
from lab.wire.gen.loadlab.mocker.v1 import admin_pb2, admin_pb2_grpc
from lab.wire.gen.openengine.v1 import model_pb2, openengine_pb2_grpc, server_pb2
from launch.port_hold import PortHold
from tests import procs
from tests.procs import mocker_argv
from tests.waiting import wait_for

CHUNK, END = int(FrameType.CHUNK), int(FrameType.END)
PROMPT = list(range(1000, 1136))  # 136 tokens


#: Faster than the defaults: a heartbeat every 0.2 s, a 5 s engine connect timeout.
SIDECAR_FLAGS = ("--heartbeat", "0.2", "--connect-attempt-timeout", "5")


def engine_argv(role: str = "aggregated", speedup: float = 0, instance: str | None = None):
    """An engine at speedup 0 (no sleeping) unless a test needs paced tokens; with its admin
    service on a port of its own (the tests inject faults)."""
    return mocker_argv(role=role, speedup=speedup, instance_id=instance, admin=True)


def sidecar_argv(engine: str, disc: Path, worker_id: str, *extra: str) -> list[str]:
    return procs.sidecar_argv(engine, disc, worker_id, *SIDECAR_FLAGS, *extra)


async def collect(stream, timeout: float = 20) -> tuple[list[int], dict, int]:
    tokens: list[int] = []
    chunks = 0
    async with asyncio.timeout(timeout):
        async for ftype, payload in stream:
            if ftype == CHUNK:
                tokens += payload["t"]
                chunks += 1
            else:
                return tokens, payload, chunks
    raise AssertionError("no END")


def request(rid: str, **kw) -> dict:
    return {
        "request_id": rid,
        "model": "mocker-model",
        "token_ids": PROMPT,
        "max_tokens": 16,
        "ignore_eos": True,
        **kw,
    }


async def wait_gone(registry: FileRegistry, worker_id: str, timeout: float = 10) -> None:
    async with asyncio.timeout(timeout):
        while any(r.worker_id == worker_id for r in await registry.list()):
            await asyncio.sleep(0.02)


async def wait_exit(proc, timeout: float = 20) -> int:
    async with asyncio.timeout(timeout):
        while proc.popen.poll() is None:
            await asyncio.sleep(0.02)
    return proc.popen.returncode


async def test_sidecar_registers_and_serves(spawn, disc: Path, registry: FileRegistry) -> None:
    engine = spawn("engine-0", engine_argv(instance="engine-0-aaaa"))
    sidecar = spawn("sidecar-0", sidecar_argv(engine.address, disc, "sidecar-0"))
    assert sidecar.ready["role"] == "sidecar" and sidecar.ready["id"] == "sidecar-0"
    (record,) = await registry.list()
    assert record.address == sidecar.address and record.role == "aggregated"
    assert record.instance_id == "engine-0-aaaa" and record.context_length == 32768
    assert record.pid == sidecar.pid
    client = RequestPlaneClient(record.address)
    try:
        results = await asyncio.gather(
            *[
                collect(await client.open_stream(request(f"r-{i}", max_tokens=16 + i)))
                for i in range(8)
            ]
        )
        for i, (tokens, end, chunks) in enumerate(results):
            assert len(tokens) == 16 + i and end["error"] is None, end
            assert end["finish"] == "length" and end["worker_id"] == "sidecar-0"
            assert end["usage"]["prompt_tokens"] == 136
            assert end["usage"]["completion_tokens"] == 16 + i
            assert 1 <= chunks <= len(tokens)
        _, end, _ = await collect(await client.open_stream(request("bad", token_ids=[])))
        assert end["error"]["kind"] == "invalid_request"
    finally:
        await client.close()
    # A sidecar must not load pandas or matplotlib (their extension modules would be mapped).
    maps = Path(f"/proc/{sidecar.pid}/maps").read_text()
    assert "pandas" not in maps and "matplotlib" not in maps


async def test_prefill_handoff_decode_and_mangled_handoff(
    spawn, disc: Path, registry: FileRegistry
) -> None:
    pe = spawn("engine-prefill-0", engine_argv("prefill"))
    de = spawn("engine-decode-0", engine_argv("decode"))
    spawn("sidecar-prefill-0", sidecar_argv(pe.address, disc, "sidecar-prefill-0"))
    spawn("sidecar-decode-0", sidecar_argv(de.address, disc, "sidecar-decode-0"))
    records = {r.worker_id: r for r in await registry.list()}
    assert records["sidecar-prefill-0"].role == "prefill"
    assert records["sidecar-decode-0"].role == "decode"
    prefill = RequestPlaneClient(records["sidecar-prefill-0"].address)
    decode = RequestPlaneClient(records["sidecar-decode-0"].address)
    try:
        tokens, end, _ = await collect(await prefill.open_stream(request("d-1", max_tokens=12)))
        assert tokens == [] and end["error"] is None, end
        assert end["finish"] == "length" and end["worker_id"] == "sidecar-prefill-0"
        handoff = end["handoff"]
        assert set(handoff) >= {
            "session_id",
            "transfer_backend",
            "endpoints",
            "dp_rank",
            "attributes",
        }
        assert handoff["transfer_backend"] == "MOCKER"
        first = handoff["attributes"]["mocker_first_gen_tokens"][0]
        cached = end["usage"]["cached_tokens"]
        leg = request("d-1", max_tokens=12, handoff=handoff, prefill_cached_tokens=cached)
        tokens, dend, _ = await collect(await decode.open_stream(leg))
        assert dend["error"] is None, dend
        assert len(tokens) == 12 and tokens[0] == first  # the prefill's first token, replayed
        assert dend["usage"]["cached_tokens"] == cached and dend["worker_id"] == "sidecar-decode-0"
        # Mangled on purpose: a missing key is caught by the sidecar, naming the key ...
        broken = {k: v for k, v in handoff.items() if k != "dp_rank"}
        _, bend, _ = await collect(
            await decode.open_stream({**leg, "request_id": "d-2", "handoff": broken})
        )
        assert (
            bend["error"]["kind"] == "invalid_request" and "'dp_rank'" in bend["error"]["message"]
        )
        assert bend["error"]["status"] == 400
        # ... a mangled value by the decode engine's strict validation: a clear error, no hang.
        tokens, end, _ = await collect(await prefill.open_stream(request("d-3")))
        bad = {
            **end["handoff"],
            "attributes": {**end["handoff"]["attributes"], "mocker_ttft_ms": 12},
        }
        leg3 = request("d-3", handoff=bad)
        _, bend, _ = await collect(await decode.open_stream(leg3))
        assert bend["error"]["kind"] == "invalid_request", bend
        assert "mocker_ttft_ms" in bend["error"]["message"]
        # A handoff sent to the prefill worker is refused.
        _, pend, _ = await collect(await prefill.open_stream({**leg, "request_id": "d-4"}))
        assert pend["error"]["kind"] == "invalid_request"
    finally:
        await prefill.close()
        await decode.close()


async def running(address: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        load = await openengine_pb2_grpc.ControlStub(channel).GetLoad(server_pb2.GetLoadRequest())
        return load.running_requests


async def test_cancel_stops_the_engine_request(spawn, disc: Path) -> None:
    engine = spawn("engine-0", engine_argv(speedup=1))
    sidecar = spawn("sidecar-0", sidecar_argv(engine.address, disc, "sidecar-0"))
    client = RequestPlaneClient(sidecar.address)
    try:
        stream = await client.open_stream(request("c-1", max_tokens=5000))
        async with asyncio.timeout(10):
            ftype, _ = await anext(stream)
        assert ftype == CHUNK
        assert await running(engine.address) == 1
        await stream.cancel()
        _, end, _ = await collect(stream)
        assert end["finish"] == "cancelled"
        async with asyncio.timeout(5):
            while await running(engine.address) != 0:
                await asyncio.sleep(0.05)
    finally:
        await client.close()


async def test_missing_context_length_is_a_startup_error(spawn, tmp_path: Path) -> None:
    class NoContext(openengine_pb2_grpc.ControlServicer):
        async def GetServerInfo(self, request, context):
            return server_pb2.ServerInfo(
                engine_role=server_pb2.ENGINE_ROLE_AGGREGATED, instance_id="nocontext-1"
            )

        async def GetModelInfo(self, request, context):
            return model_pb2.ModelInfo(model_id="m")  # no max_context_length

    server = grpc.aio.server()
    openengine_pb2_grpc.add_ControlServicer_to_server(NoContext(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        proc = spawn(
            "sidecar-0",
            sidecar_argv(f"127.0.0.1:{port}", tmp_path / "disc", "sidecar-0"),
            ready=False,
        )
        assert await wait_exit(proc) == 1
        log = proc.log()
        assert "no max_context_length" in log and "Traceback" not in log
        assert "ready role=" not in log
    finally:
        await server.stop(0)


async def test_sigterm_withdraws_then_exits_0(spawn, disc: Path, registry: FileRegistry) -> None:
    engine = spawn("engine-0", engine_argv())
    sidecar = spawn(
        "sidecar-0", sidecar_argv(engine.address, disc, "sidecar-0", "--grace-period", "1")
    )
    assert [r.worker_id for r in await registry.list()] == ["sidecar-0"]
    started = time.monotonic()
    sidecar.signal(signal.SIGTERM)
    await wait_gone(registry, "sidecar-0")
    assert sidecar.popen.poll() is None  # withdrawn first, still serving the grace period
    client = RequestPlaneClient(sidecar.address)
    try:
        tokens, end, _ = await collect(await client.open_stream(request("g-1", max_tokens=4)))
        assert end["error"] is None and len(tokens) == 4
    finally:
        await client.close()
    assert await wait_exit(sidecar) == 0
    assert time.monotonic() - started >= 0.9
    assert "exiting with code 0" in sidecar.log()


async def test_the_grace_ends_once_no_connected_frontend_is_left(
    spawn, disc: Path, registry: FileRegistry
) -> None:
    """A frontend connected at the withdrawal is still served during the grace (60 s here);
    once its connection closes (a whole stack's teardown: its frontend stops too) nothing can
    route here any more, and the sidecar exits without waiting out the grace."""
    engine = spawn("engine-0", engine_argv())
    sidecar = spawn(
        "sidecar-0", sidecar_argv(engine.address, disc, "sidecar-0", "--grace-period", "60")
    )
    client = RequestPlaneClient(sidecar.address)
    try:
        _, end, _ = await collect(await client.open_stream(request("c-1", max_tokens=2)))
        assert end["error"] is None
        sidecar.signal(signal.SIGTERM)
        await wait_gone(registry, "sidecar-0")
        tokens, end, _ = await collect(await client.open_stream(request("c-2", max_tokens=4)))
        assert end["error"] is None and len(tokens) == 4  # served in the grace
        assert sidecar.popen.poll() is None
    finally:
        await client.close()
    closed = time.monotonic()
    assert await wait_exit(sidecar, timeout=30) == 0
    assert time.monotonic() - closed < 15, "the sidecar waited out its grace period"
    assert "the grace period ends early" in sidecar.log()


async def test_a_second_sigterm_ends_the_grace_and_the_drain_at_once(
    spawn, disc: Path, registry: FileRegistry
) -> None:
    """A sidecar no frontend ever connected to serves its whole grace after SIGTERM (60 s here:
    a frontend that read its record may still come); a second SIGTERM stops it now."""
    engine = spawn("engine-0", engine_argv())
    sidecar = spawn(
        "sidecar-0", sidecar_argv(engine.address, disc, "sidecar-0", "--grace-period", "60")
    )
    sidecar.signal(signal.SIGTERM)
    await wait_gone(registry, "sidecar-0")
    await wait_for(lambda: "serving for the 60 s grace period" in sidecar.log())
    assert sidecar.popen.poll() is None
    again = time.monotonic()
    sidecar.signal(signal.SIGTERM)
    assert await wait_exit(sidecar, timeout=30) == 0
    assert time.monotonic() - again < 15, "the sidecar waited out its grace period"
    assert "SIGTERM received again: no grace period, no drain" in sidecar.log()


@pytest.mark.parametrize("fault", ["not_serving", "kill"])
async def test_engine_loss_withdraws_while_running_then_exits_1(
    spawn, disc: Path, registry: FileRegistry, fault: str
) -> None:
    engine = spawn("engine-0", engine_argv(speedup=1, instance="engine-0-bbbb"))
    sidecar = spawn(
        "sidecar-0", sidecar_argv(engine.address, disc, "sidecar-0", "--grace-period", "1.5")
    )
    client = RequestPlaneClient(sidecar.address)
    try:
        stream = await client.open_stream(request("l-1", max_tokens=5000))  # still running later
        async with asyncio.timeout(10):
            await anext(stream)
        if fault == "not_serving":
            async with grpc.aio.insecure_channel(engine.ready["admin"]) as channel:
                await admin_pb2_grpc.AdminStub(channel).SetHealth(
                    admin_pb2.SetHealthRequest(service="liveness", status=2)
                )
        else:
            engine.popen.send_signal(signal.SIGKILL)
        await wait_gone(registry, "sidecar-0")
        if fault == "not_serving":
            assert sidecar.popen.poll() is None  # left discovery while still running (draining)
        _, end, _ = await collect(stream)
        assert end["error"] is not None
        assert await wait_exit(sidecar) == 1
    finally:
        await client.close()
    log = sidecar.log()
    assert "ERROR" in log and "engine lost: " in log
    if fault == "not_serving":
        assert "engine lost: liveness status NOT_SERVING (instance engine-0-bbbb)" in log


def engine_connections(pid: int, engine_port: int, side: str) -> list:
    """Process `pid`'s ESTABLISHED TCP connections to (side="remote") or on (side="local") the
    engine's gRPC port, as the kernel lists them."""
    conns = psutil.Process(pid).net_connections(kind="tcp")
    return [
        c
        for c in conns
        if c.status == psutil.CONN_ESTABLISHED
        and (c.raddr if side == "remote" else c.laddr)
        and (c.raddr if side == "remote" else c.laddr).port == engine_port
    ]


async def test_one_connection_carries_generate_control_and_the_liveness_watch(
    spawn, disc: Path, registry: FileRegistry
) -> None:
    """The sidecar holds exactly ONE TCP connection to its engine while a Generate streams and
    the heartbeat's GetLoad runs (counted on both ends by the kernel), and the liveness watch
    lives on it: liveness NOT_SERVING, set through the admin port, takes the worker out."""
    engine = spawn("engine-0", engine_argv(speedup=1, instance="engine-0-one"))
    sidecar = spawn(
        "sidecar-0", sidecar_argv(engine.address, disc, "sidecar-0", "--grace-period", "1")
    )
    port = int(engine.address.rpartition(":")[2])
    client = RequestPlaneClient(sidecar.address)
    try:
        stream = await client.open_stream(request("one-1", max_tokens=5000))  # still running
        async with asyncio.timeout(10):
            assert (await anext(stream))[0] == CHUNK

        async def heartbeat_saw_the_stream() -> bool:  # a GetLoad answered while it streams
            return any(r.load.get("in_flight") == 1 for r in await registry.list())

        await wait_for(heartbeat_saw_the_stream, timeout=10, what="a heartbeat in flight")
        assert len(engine_connections(sidecar.pid, port, "remote")) == 1
        assert len(engine_connections(engine.pid, port, "local")) == 1
        async with grpc.aio.insecure_channel(engine.ready["admin"]) as channel:
            await admin_pb2_grpc.AdminStub(channel).SetHealth(
                admin_pb2.SetHealthRequest(service="liveness", status=2)
            )
        await wait_gone(registry, "sidecar-0")
        _, end, _ = await collect(stream)
        assert end["error"] is not None
        assert await wait_exit(sidecar) == 1
    finally:
        await client.close()
    assert "engine lost: liveness status NOT_SERVING (instance engine-0-one)" in sidecar.log()


async def test_the_startup_wait_says_why_and_ends_when_the_engine_comes(spawn, disc: Path,
                                                                        tmp_path: Path) -> None:
    """No engine on the port: the log says "connection refused since HH:MM:SS, attempt N"
    (not a bare DEADLINE_EXCEEDED after an attempt timeout); an engine that starts there later
    is picked up; with a short deadline the exit message carries the same reason."""
    hold = PortHold()  # refuses connections until the engine listens beside it
    target = f"127.0.0.1:{hold.port}"
    waiting = spawn("sidecar-0", sidecar_argv(target, disc, "sidecar-0", "--startup-deadline",
                                              "120"), ready=False)
    pattern = re.compile(rf"waiting for engine {target}: connection refused since "
                         r"\d\d:\d\d:\d\d, attempt \d+")
    # well within the 5 s attempt timeout: the refusal is seen at the first connect
    await wait_for(lambda: pattern.search(waiting.log()) is not None, timeout=4.5,
                   what="the waiting line")
    spawn("engine-0", [*engine_argv(instance="engine-0-late"), "--listen", target])
    await wait_for(lambda: "ready role=sidecar" in waiting.log(), timeout=60,
                   what="the sidecar's ready line once the engine is up")
    hold.close()

    with PortHold() as nobody:  # nothing listens there while the sidecar waits
        quitter = spawn("sidecar-1", sidecar_argv(f"127.0.0.1:{nobody.port}", tmp_path / "d1",
                                                  "sidecar-1", "--startup-deadline", "1.5"),
                        ready=False)
        assert await wait_exit(quitter) == 1
    log = quitter.log()
    assert re.search(r"start-up deadline \(connection refused since \d\d:\d\d:\d\d, attempt "
                     r"\d+\)", log), log
    assert "Traceback" not in log
