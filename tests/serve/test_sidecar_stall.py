"""Progress-based liveness over real processes: a frozen or SIGSTOPped engine takes its worker
out of discovery (in-flight requests end retryable, the sidecar stays up), and the worker
registers again on its own once the engine serves; a sidecar never registers a frozen engine."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import grpc
import pytest

from lab.serve.discovery.file_store import FileRegistry
from lab.serve.request_plane import RequestPlaneClient
from lab.serve.sidecar.progress import StallCheck
from lab.wire.gen.loadlab.mocker.v1 import admin_pb2, admin_pb2_grpc
from tests.serve.test_sidecar_process import (
    collect,
    engine_argv,
    request,
    sidecar_argv,
    wait_gone,
)

# Generous bounds for a loaded 2-core machine; the benchmark figures are measured by
# `lab sweep --fault`, not here.
WITHDRAW_BOUND_S = 15.0
RETURN_BOUND_S = 20.0


async def freeze(admin: str, frozen: bool) -> None:
    async with grpc.aio.insecure_channel(admin) as channel:
        await admin_pb2_grpc.AdminStub(channel).Freeze(
            admin_pb2.FreezeRequest(frozen=frozen), timeout=10
        )


async def wait_registered(registry: FileRegistry, worker_id: str, timeout: float) -> None:
    async with asyncio.timeout(timeout):
        while not any(r.worker_id == worker_id for r in await registry.list()):
            await asyncio.sleep(0.05)


def stall_engine_argv() -> list[str]:
    return engine_argv(speedup="1", instance="engine-0-stall")


async def streaming(spawn, disc: Path, *sidecar_flags: str):
    """An engine at speedup 1, its sidecar with `sidecar_flags`, and one long request whose
    tokens are flowing: (engine, sidecar, client, stream)."""
    engine = spawn("engine-0", stall_engine_argv())
    sidecar = spawn("sidecar-0", sidecar_argv(engine.address, disc, "sidecar-0", *sidecar_flags))
    client = RequestPlaneClient(sidecar.address)
    stream = await client.open_stream(request("s-1", max_tokens=100_000))
    async with asyncio.timeout(10):
        await anext(stream)
    return engine, sidecar, client, stream


def test_stall_check_counts_only_busy_time() -> None:
    check = StallCheck(2.0, now=0.0)
    check.load_sample(None, 10.0)
    assert check.check(messages=0, active=0, now=10.0) is None  # idle: no token clock
    # Requests arrive: the clock starts at the last idle poll (10.0).
    assert check.check(messages=0, active=3, now=10.2) is None
    assert check.check(messages=0, active=3, now=11.9) is None
    reason = check.check(messages=0, active=3, now=12.5)
    assert reason is not None and "no token progress" in reason and "3 requests" in reason
    check.reset(20.0)
    assert check.check(messages=5, active=1, now=21.0) is None
    assert check.check(messages=6, active=1, now=22.5) is None  # progress resets the clock
    # Idle and no GetLoad asked: nothing to judge, however long since the last sample.
    assert check.check(messages=6, active=0, now=24.6) is None
    # A GetLoad outstanding while the engine shows no sign of life for longer than the window:
    # stalled (a stopped process). The clock starts at the ask or the last token, whichever is
    # later (the last token progress was at 22.5).
    check.load_asked(22.0)
    assert check.check(messages=6, active=0, now=24.4) is None
    assert check.check(messages=6, active=0, now=24.6) is not None
    check.load_sample(None, 25.0)
    assert check.check(messages=6, active=0, now=26.0) is None
    # A load timestamp that advanced once and then stands still (a frozen engine loop) is no
    # progress; one that never moved (an engine that does not stamp) is not held against it.
    s = 10**9
    check.load_asked(24.0)
    check.load_sample(24 * s, 24.0, wall_ns=24 * s)  # fresh
    check.load_sample(24 * s, 25.0, wall_ns=25 * s)  # the same stamp, still fresh
    check.load_sample(24 * s, 26.5, wall_ns=26 * s + s // 2)  # stale and unchanged: frozen
    assert check.check(messages=6, active=0, now=26.9) is None  # 1.9 s since the live answer
    check.load_sample(24 * s, 27.5, wall_ns=27 * s + s // 2)
    reason = check.check(messages=6, active=0, now=28.6)
    assert reason is not None and "GetLoad" in reason
    still = StallCheck(2.0, now=0.0)
    for t in range(10):  # never fresh, never moving: an engine that does not stamp samples
        still.load_asked(float(t))
        still.load_sample(7, float(t), wall_ns=t * s + 10**15)
    assert still.check(messages=0, active=0, now=9.5) is None


@pytest.mark.parametrize("fault", ["freeze", "stop"])
async def test_stalled_engine_leaves_rotation_and_returns(
    spawn, disc: Path, registry: FileRegistry, fault: str
) -> None:
    engine, sidecar, client, stream = await streaming(spawn, disc, "--stall", "1")
    admin = engine.ready["admin"]
    try:
        started = time.monotonic()
        if fault == "freeze":
            await freeze(admin, True)
        else:
            engine.popen.send_signal(signal.SIGSTOP)
        try:
            await wait_gone(registry, "sidecar-0", timeout=WITHDRAW_BOUND_S)
            withdrawn_after = time.monotonic() - started
            # The in-flight request ends at once with a retryable error, not at its timeout.
            _, end, _ = await collect(stream, timeout=10)
            assert end["error"]["kind"] == "unavailable", end
            assert "engine stalled" in end["error"]["message"]
            # A new request is refused as unavailable (the frontend tries another worker).
            _, end, _ = await collect(await client.open_stream(request("s-2")), timeout=10)
            assert end["error"]["kind"] == "unavailable" and "stalled" in end["error"]["message"]
            assert sidecar.popen.poll() is None  # the sidecar stays up, out of rotation
        finally:
            if fault == "freeze":
                await freeze(admin, False)
            else:
                engine.popen.send_signal(signal.SIGCONT)
        resumed = time.monotonic()
        await wait_registered(registry, "sidecar-0", RETURN_BOUND_S)
        returned_after = time.monotonic() - resumed
        tokens, end, _ = await collect(await client.open_stream(request("s-3", max_tokens=4)))
        assert end["error"] is None and len(tokens) == 4
    finally:
        await client.close()
    log = sidecar.log()
    assert "engine stalled: " in log and "registered again" in log and "Traceback" not in log
    print(f"{fault}: withdrawn after {withdrawn_after:.2f} s, back {returned_after:.2f} s "
          "after the resume")


async def test_a_frozen_engine_is_never_registered(
    spawn, disc: Path, registry: FileRegistry
) -> None:
    engine = spawn("engine-0", stall_engine_argv())
    await freeze(engine.ready["admin"], True)
    sidecar = spawn(
        "sidecar-0",
        sidecar_argv(engine.address, disc, "sidecar-0", "--probe-timeout", "0.5"),
        ready=False,
    )
    sidecar.wait_log("cannot serve yet", timeout=30)
    await asyncio.sleep(1.0)
    assert await registry.list() == [] and sidecar.popen.poll() is None
    log = sidecar.log()
    assert "ready role=" not in log and "engine stalled" not in log  # never registered
    await freeze(engine.ready["admin"], False)
    await asyncio.to_thread(sidecar.wait_ready, 30)
    await wait_registered(registry, "sidecar-0", 5)


#: A deep queue: 2 sequences run at once, 24x as many requests wait behind them.
DEEP_QUEUE_ENGINE_ARGS = '{"max_num_seqs": 2}'
DEEP_QUEUE_REQUESTS = 48
#: GetLoad samples sparser than the stall window: what a busy sidecar sees when its samples
#: answer late under load (docs/scale.md, run B), made certain on a quiet machine. Twice the
#: window is enough: the former rule (idle 1 s after the last answer: withdrawn) fires before
#: the next sample; each gap is waited twice (the idle refresh, the SIGSTOP's unanswered ask).
SPARSE_SAMPLES = ("--heartbeat", "2", "--ttl", "30", "--stall", "1")


async def test_a_deep_queue_making_progress_is_never_withdrawn(
    spawn, disc: Path, registry: FileRegistry
) -> None:
    """Many more requests than max_num_seqs, GetLoad samples rarer than --stall: the queue drains
    with every request served (no 503) and the worker never leaves discovery, also once idle;
    then a SIGSTOPped idle engine (GetLoad unanswered) is still withdrawn."""
    engine = spawn("engine-0", [*engine_argv(speedup=1, instance="engine-0-deep"),
                                "--engine-args", DEEP_QUEUE_ENGINE_ARGS])
    sidecar = spawn("sidecar-0", sidecar_argv(engine.address, disc, "sidecar-0", *SPARSE_SAMPLES))
    client = RequestPlaneClient(sidecar.address)
    try:
        async def one(i: int) -> dict:
            _, end, _ = await collect(
                await client.open_stream(request(f"q-{i}", max_tokens=24)), timeout=120)
            return end

        ends = await asyncio.gather(*(one(i) for i in range(DEEP_QUEUE_REQUESTS)))
        drained = time.time()
        assert [e for e in ends if e["error"] is not None] == []
        # Idle after the burst: wait for a heartbeat refresh at least 2 stall windows later.
        async with asyncio.timeout(30):
            while True:
                records = await registry.list()
                assert [r.worker_id for r in records] == ["sidecar-0"], sidecar.log()
                if records[0].updated_at > drained + 2.0:
                    break
                await asyncio.sleep(0.05)
        assert "engine stalled" not in sidecar.log()
        engine.popen.send_signal(signal.SIGSTOP)
        try:
            await wait_gone(registry, "sidecar-0", timeout=WITHDRAW_BOUND_S)
        finally:
            engine.popen.send_signal(signal.SIGCONT)
        await wait_registered(registry, "sidecar-0", RETURN_BOUND_S)
    finally:
        await client.close()
    log = sidecar.log()
    assert "engine stalled: GetLoad has shown no progress" in log, log
    assert log.count("engine stalled") == 1 and "Traceback" not in log


#: Keepalive PINGs every 0.3 s of silence, dead after 1 s without an ACK; a stall window far
#: beyond the test, so only the keepalive can catch the frozen engine.
KEEPALIVE_FLAGS = ("--keepalive", "0.3", "--keepalive-timeout", "1", "--stall", "600",
                   "--stale-load", "600")
KEEPALIVE_BOUND_S = 15.0


async def test_a_sigstopped_engine_leaves_rotation_by_the_keepalive_and_returns(
    spawn, disc: Path, registry: FileRegistry
) -> None:
    """SIGSTOP under load: the kernel keeps the TCP connection open, so only an unanswered HTTP/2
    PING shows the engine is gone. The sidecar withdraws it from the liveness path (the reason
    names the keepalive), ends the in-flight request retryable, and registers it again after
    SIGCONT."""
    engine, sidecar, client, stream = await streaming(spawn, disc, *KEEPALIVE_FLAGS)
    try:
        started = time.monotonic()
        engine.popen.send_signal(signal.SIGSTOP)
        try:
            await wait_gone(registry, "sidecar-0", timeout=KEEPALIVE_BOUND_S)
            withdrawn_after = time.monotonic() - started
            _, end, _ = await collect(stream, timeout=10)
            assert end["error"]["kind"] == "unavailable", end
            assert "keepalive" in end["error"]["message"], end
            assert sidecar.popen.poll() is None  # out of rotation, not lost
        finally:
            engine.popen.send_signal(signal.SIGCONT)
        await wait_registered(registry, "sidecar-0", RETURN_BOUND_S)
        tokens, end, _ = await collect(await client.open_stream(request("k-2", max_tokens=4)))
        assert end["error"] is None and len(tokens) == 4
    finally:
        await client.close()
    log = sidecar.log()
    assert "engine stalled: liveness watch: Connection lost: keepalive watchdog timeout" in log, log
    assert "declared dead" in log and "registered again" in log and "Traceback" not in log
    assert "engine lost" not in log
    print(f"keepalive: withdrawn {withdrawn_after:.2f} s after SIGSTOP")
