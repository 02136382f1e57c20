"""Process-level behaviour of `mocker serve`: the ready line, graceful SIGTERM (liveness
NOT_SERVING, Watch streams end, in-flight requests finish within the grace, exit 0), admin
Exit and ExecutorFailure, and the consumer-stall watchdog (each test owns its process)."""

from __future__ import annotations

import asyncio
import re
import signal
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lab.wire.gen.loadlab.mocker.v1 import admin_pb2
from lab.wire.gen.openengine.v1 import error_pb2, openengine_pb2_grpc
from lab.wire.gen.openengine.v1 import generation_pb2 as g
from tests.mocker.test_server_support import (
    Engine,
    assert_one_terminal,
    mocker_argv,
    request,
    tokens_of,
)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _engine(spawn, name: str, *extra: str) -> Engine:
    proc = spawn(name, mocker_argv(*extra))
    return Engine(
        proc, grpc.insecure_channel(proc.address), grpc.insecure_channel(proc.ready["admin"])
    )


def _exit_code(engine: Engine, timeout: float) -> int | None:
    try:
        return engine.proc.popen.wait(timeout)
    except Exception:
        return None


def test_ready_line_names_the_instance_and_the_bound_port(spawn):
    e = _engine(spawn, "engine-ready", "--speedup-ratio", "0", "--instance-id", "engine-0-1a2b3c4d")
    line = next(ln for ln in e.proc.log().splitlines() if "ready role=" in ln)
    m = re.search(
        r"ready role=engine id=engine-0-1a2b3c4d listen=127\.0\.0\.1:(\d+) admin=127\.0\.0\.1:\d+$",
        line,
    )
    assert m and int(m.group(1)) > 0
    out = e.generate(request("ready-1", max_tokens=1))
    assert assert_one_terminal(out).finished.reason == g.FINISH_REASON_LENGTH
    e.channel.close()


def test_sigterm_ends_watch_streams_lets_in_flight_requests_finish_and_exits_0(spawn):
    e = _engine(spawn, "engine-term", "--speedup-ratio", "1")
    health = health_pb2_grpc.HealthStub(e.channel)
    seen: list[int] = []
    watch_end: list[object] = []

    def watch() -> None:
        try:
            for resp in health.Watch(health_pb2.HealthCheckRequest(service="liveness"), timeout=30):
                seen.append(resp.status)
            watch_end.append("ok")
        except grpc.RpcError as exc:
            watch_end.append(exc.code())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    call = e.inference.Generate(request("term-1", max_tokens=150), timeout=30)
    out = [next(call)]
    assert seen == [SERVING]
    t0 = time.monotonic()
    e.proc.signal(signal.SIGTERM)
    watcher.join(5)
    assert seen == [SERVING, NOT_SERVING] and watch_end == ["ok"]  # the Watch ended cleanly
    with grpc.insecure_channel(e.address) as ch2:  # new work is refused while draining
        try:
            late_engine = Engine(e.proc, ch2, ch2)
            list(late_engine.inference.Generate(request("late", max_tokens=1), timeout=5))
            late = None
        except grpc.RpcError as exc:
            late = exc.code()
    assert late == grpc.StatusCode.UNAVAILABLE
    out.extend(call)
    last = assert_one_terminal(out)
    assert last.finished.reason == g.FINISH_REASON_LENGTH and len(tokens_of(out)) == 150
    assert _exit_code(e, 10) == 0
    assert time.monotonic() - t0 < 6
    e.channel.close()


def test_sigterm_grace_bounds_requests_that_would_not_finish(spawn):
    e = _engine(spawn, "engine-grace", "--speedup-ratio", "1", "--grace", "0.5")
    call = e.inference.Generate(request("grace-1", max_tokens=20000), timeout=30)
    next(call)
    t0 = time.monotonic()
    e.proc.signal(signal.SIGTERM)
    try:
        list(call)
        ended = None
    except grpc.RpcError as exc:
        ended = exc.code()
    assert ended is not None  # cut at the end of the grace, without a terminal
    assert _exit_code(e, 10) == 0
    assert time.monotonic() - t0 < 4
    e.channel.close()


def test_admin_exit_ends_the_process_with_the_given_code(spawn):
    e = _engine(spawn, "engine-exit", "--speedup-ratio", "0")
    reply = e.admin.Exit(admin_pb2.ExitRequest(code=3), timeout=10)
    assert "3" in reply.message
    assert _exit_code(e, 10) == 3
    e.channel.close()


def test_executor_failure_sets_liveness_not_serving_and_fails_in_flight_requests(spawn):
    e = _engine(spawn, "engine-fail", "--speedup-ratio", "1")
    health = health_pb2_grpc.HealthStub(e.channel)
    watch = health.Watch(health_pb2.HealthCheckRequest(service="liveness"), timeout=30)
    assert next(watch).status == SERVING
    call = e.inference.Generate(request("fail-1", max_tokens=2000), timeout=30)
    out = [next(call)]
    e.admin.ExecutorFailure(admin_pb2.ExecutorFailureRequest(message="GPU fell off"), timeout=10)
    assert next(watch).status == NOT_SERVING
    out.extend(call)
    last = assert_one_terminal(out)
    assert last.error.code == error_pb2.ERROR_CODE_INTERNAL and not last.error.retryable
    assert "GPU fell off" in last.error.message
    try:
        e.generate(request("fail-2", max_tokens=1))
        after = None
    except grpc.RpcError as exc:
        after = exc.code()
    assert after == grpc.StatusCode.UNAVAILABLE
    check = health.Check(health_pb2.HealthCheckRequest(service="inference"), timeout=10)
    assert check.status == SERVING  # only liveness is affected
    watch.cancel()
    e.channel.close()


def test_a_stalled_consumer_gets_an_overloaded_retryable_error(spawn):
    e = _engine(spawn, "engine-stall", "--speedup-ratio", "0", "--stall-timeout", "1")
    big = request("slow-reader", max_tokens=30000, output_logprobs=True, output_top_n=20)
    # A client with a small, fixed flow-control window, so an undrained stream blocks the
    # server's writes quickly (gRPC's adaptive window would buffer megabytes first).
    small_window = grpc.insecure_channel(
        e.address, options=[("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 16384)]
    )
    call = openengine_pb2_grpc.InferenceStub(small_window).Generate(big, timeout=60)
    first = next(call)
    time.sleep(3)  # stop draining: the server's writes block on flow control
    out = [first, *call]
    last = assert_one_terminal(out)
    assert last.error.code == error_pb2.ERROR_CODE_OVERLOADED and last.error.retryable
    assert len(tokens_of(out)) < 30000
    assert "stalled" in e.proc.log()
    small_window.close()
    # a reader that keeps up is never cut
    out = e.generate(request("fast-reader", max_tokens=3000))
    assert assert_one_terminal(out).finished.reason == g.FINISH_REASON_LENGTH
    e.channel.close()


async def test_a_failing_engine_loop_fails_requests_in_band_and_stops_the_server(monkeypatch):
    """In-process: a scheduler that raises. The in-flight request ends with INTERNAL, liveness
    drops, the server stops by itself and reports the failure (serve() exits 1).

    The broken scheduler is patched in: a scheduler bug is what no input can cause, so the
    public surface (CLI, engine args, Admin) has no way to make one."""
    from lab.shared.engine_settings import EngineSettings
    from mocker.engine import Scheduler
    from mocker.server import app
    from mocker.server.config import ServerConfig

    class Broken(Scheduler):
        def step(self, now_ms):
            raise RuntimeError("scheduler bug")

    monkeypatch.setattr(app, "Scheduler", Broken)
    settings = EngineSettings(listen="127.0.0.1:0", speedup_ratio=0.0)
    server = app.MockerServer(ServerConfig.from_settings(settings))
    address = await server.start()
    run = asyncio.create_task(server.run_until_stopped())
    async with grpc.aio.insecure_channel(address) as channel:
        stub = openengine_pb2_grpc.InferenceStub(channel)
        out = [r async for r in stub.Generate(request("broken-1", max_tokens=3))]
    last = assert_one_terminal(out)
    assert last.error.code == error_pb2.ERROR_CODE_INTERNAL
    assert "scheduler bug" in last.error.message
    await asyncio.wait_for(run, 10)
    assert isinstance(server.failed, RuntimeError)
    assert server.health.status("liveness") == NOT_SERVING


def test_default_flags_expose_no_fault_injection(spawn):
    """A hand-launched engine (no --admin-listen) has no admin service on its inference port,
    and its ready line names no admin address."""
    proc = spawn("engine-plain", ["python", "-m", "mocker", "serve", "--listen", "127.0.0.1:0",
                                  "--speedup-ratio", "0"])
    assert "admin" not in proc.ready
    with grpc.insecure_channel(proc.address) as channel:
        from lab.wire.gen.loadlab.mocker.v1 import admin_pb2_grpc

        admin = admin_pb2_grpc.AdminStub(channel)
        for call, req in (
            (admin.Exit, admin_pb2.ExitRequest(code=0)),
            (admin.Freeze, admin_pb2.FreezeRequest(frozen=True)),
            (admin.StallTokens, admin_pb2.StallTokensRequest(seconds=1)),
        ):
            with pytest.raises(grpc.RpcError) as info:
                call(req, timeout=10)
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        # Still serving: nothing reached the engine.
        health = health_pb2_grpc.HealthStub(channel)
        assert health.Check(health_pb2.HealthCheckRequest(service="liveness"),
                            timeout=10).status == SERVING
    assert proc.popen.poll() is None


BAD_ADMIN_CALLS = [
    ("StallTokens", admin_pb2.StallTokensRequest(seconds=1e308), "seconds"),
    ("StallTokens", admin_pb2.StallTokensRequest(seconds=float("nan")), "seconds"),
    ("StallTokens", admin_pb2.StallTokensRequest(seconds=-1), "seconds"),
    ("Exit", admin_pb2.ExitRequest(code=256), "code"),
    ("Exit", admin_pb2.ExitRequest(code=-1), "code"),
    ("SetHealth", admin_pb2.SetHealthRequest(service="x" * 10_000, status=1), "service"),
]


def test_admin_arguments_are_bounded(spawn):
    e = _engine(spawn, "engine-bounds", "--speedup-ratio", "0")
    for method, req, names in BAD_ADMIN_CALLS:
        with pytest.raises(grpc.RpcError) as info:
            getattr(e.admin, method)(req, timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method
        assert names in info.value.details() and len(info.value.details()) < 300
    assert e.proc.popen.poll() is None
    assert e.admin.StallTokens(admin_pb2.StallTokensRequest(seconds=0), timeout=10).message
