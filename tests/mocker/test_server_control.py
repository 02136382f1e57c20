"""Control RPCs, abort claim semantics, grpc.health.v1 and the admin service over a real socket
(docs/mocker.md; docs/engine-contract.md "Services" for the admin service)."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lab.wire import constants as wc
from lab.wire.gen.loadlab.mocker.v1 import admin_pb2
from lab.wire.gen.openengine.v1 import generation_pb2 as g
from lab.wire.gen.openengine.v1 import (
    kv_pb2,
    lifecycle_pb2,
    lora_pb2,
    model_pb2,
    openengine_pb2_grpc,
)
from tests.mocker.test_server_support import (
    Engine,
    assert_one_terminal,
    engine_process,
    request,
    tokens_of,
)

ABORTED = lifecycle_pb2.ABORT_STATUS_ABORTED
ALREADY_FINISHED = lifecycle_pb2.ABORT_STATUS_ALREADY_FINISHED
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Engine:
    """A real-time engine: decode steps take ~6 ms, so requests stay in flight long enough."""
    with engine_process(tmp_path_factory.mktemp("ctl"), "engine-ctl", "--speedup-ratio", "1") as e:
        yield e


def start(engine: Engine, req: g.GenerateRequest):
    """Open a stream and wait for its first event; returns (call, [first event])."""
    call = engine.inference.Generate(req, timeout=60)
    return call, [next(call)]


# ----- model info, health RPC, refused RPCs ------------------------------------------------------


def test_model_info_reports_a_positive_context_length_for_any_model_name(engine: Engine):
    for name in ("mocker-model", "another/model", ""):
        info = engine.control.GetModelInfo(model_pb2.GetModelInfoRequest(model=name), timeout=10)
        assert info.max_context_length == 32768 > 0
        assert info.max_output_tokens == 1_000_000
        assert info.model_id == "mocker-model"
    assert not info.supports_text_input and info.supports_token_ids_input
    gen = info.generation
    for caps in (gen.prompt_logprobs, gen.output_logprobs):
        assert caps.supported and caps.max_top_n == 20
        assert list(caps.candidate_selection_modes) == [1, 2, 3]
    assert gen.HasField("guided_decoding") and not gen.guided_decoding.supported
    assert gen.max_num_sequences == 1
    assert not (gen.supports_priority or gen.supports_stop_in_output or gen.supports_cache_salt
                or gen.supports_prefix_cache_bypass)
    assert info.HasField("supports_lora") and not info.supports_lora
    assert info.HasField("supports_multimodal") and not info.supports_multimodal


def test_health_is_ready_but_the_inference_probe_is_not_simulated(engine: Engine):
    h = engine.control.Health(lifecycle_pb2.HealthRequest(), timeout=10)
    assert h.state == lifecycle_pb2.HEALTH_STATE_READY
    assert [(c.name, c.state) for c in h.checks] == [
        ("grpc", lifecycle_pb2.HEALTH_STATE_READY),
        ("scheduler", lifecycle_pb2.HEALTH_STATE_READY),
        ("model", lifecycle_pb2.HEALTH_STATE_READY),
    ]
    with pytest.raises(grpc.RpcError) as info:
        engine.control.Health(lifecycle_pb2.HealthRequest(include_inference_probe=True), timeout=10)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


def _refused(rpc, req) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        result = rpc(req, timeout=10)
        if hasattr(result, "__iter__"):
            list(result)
    return info.value


def test_kv_event_rpcs_are_unimplemented(engine: Engine):
    for rpc, req, name in (
        (engine.control.GetKvEventSources, kv_pb2.GetKvEventSourcesRequest(), "GetKvEventSources"),
        (engine.control.SubscribeKvEvents, kv_pb2.SubscribeKvEventsRequest(), "SubscribeKvEvents"),
    ):
        err = _refused(rpc, req)
        assert err.code() == grpc.StatusCode.UNIMPLEMENTED
        assert err.details() == f"{name} is not implemented by the TensorRT-LLM OpenEngine server"


def test_lora_rpcs_are_unimplemented(engine: Engine):
    for rpc, req in (
        (engine.control.LoadLora, lora_pb2.LoadLoraRequest()),
        (engine.control.UnloadLora, lora_pb2.UnloadLoraRequest(lora_name="x")),
        (engine.control.ListLoras, lora_pb2.ListLorasRequest()),
    ):
        err = _refused(rpc, req)
        assert err.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "is not implemented by the TensorRT-LLM OpenEngine server" in err.details()


# ----- abort -----------------------------------------------------------------------------------


def test_abort_reports_aborted_then_already_finished(engine: Engine):
    call, out = start(engine, request("ab-1", max_tokens=500))
    assert engine.abort("ab-1").status == ABORTED
    assert engine.abort("ab-1").status == ALREADY_FINISHED
    out.extend(call)
    last = assert_one_terminal(out)
    assert last.finished.reason == g.FINISH_REASON_CANCELLED
    assert last.usage.completion_tokens == len(tokens_of(out)) < 500
    assert engine.abort("never-seen").status == ALREADY_FINISHED
    load = engine.load()
    assert load.running_requests == 0 and load.used_kv_blocks == 0


def test_abort_after_the_terminal_reports_already_finished(engine: Engine):
    out = engine.generate(request("ab-2", max_tokens=2))
    assert out[-1].finished.reason == g.FINISH_REASON_LENGTH
    assert engine.abort("ab-2").status == ALREADY_FINISHED


def test_abort_targets_other_than_a_request_id(engine: Engine):
    with pytest.raises(grpc.RpcError) as info:
        engine.control.Abort(lifecycle_pb2.AbortRequest(), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as info:
        engine.control.Abort(
            lifecycle_pb2.AbortRequest(kv_session=kv_pb2.KvSessionRef(session_id="x")), timeout=10
        )
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    everything = lifecycle_pb2.AbortRequest(all_requests=lifecycle_pb2.AllRequests())
    assert engine.control.Abort(everything, timeout=10).status == ALREADY_FINISHED
    calls = [start(engine, request(f"all-{i}", max_tokens=500)) for i in range(2)]
    assert engine.control.Abort(everything, timeout=10).status == ABORTED
    for call, out in calls:
        out.extend(call)
        assert assert_one_terminal(out).finished.reason == g.FINISH_REASON_CANCELLED


def test_abort_before_the_terminal_reaches_the_client_cancels_it(engine: Engine):
    """The engine has finished the request, but its tokens and terminal are held back (admin
    StallTokens): an Abort now still wins, and the stream ends CANCELLED."""
    engine.admin.StallTokens(admin_pb2.StallTokensRequest(seconds=30), timeout=10)
    try:
        call = engine.inference.Generate(request("abt-1", max_tokens=3), timeout=30)
        time.sleep(0.3)  # 3 tokens take ~40 ms of simulated time
        assert engine.load().running_requests == 0  # done in the engine
        assert engine.abort("abt-1").status == ABORTED
    finally:
        engine.admin.StallTokens(admin_pb2.StallTokensRequest(seconds=0), timeout=10)
    out = list(call)
    last = assert_one_terminal(out)
    assert last.finished.reason == g.FINISH_REASON_CANCELLED
    assert tokens_of(out) == [] and last.usage.completion_tokens == 0


def test_an_abort_that_beats_submission_still_stops_generation(engine: Engine):
    """Freeze the engine loop so the request is registered but never submitted; abort it."""
    engine.admin.Freeze(admin_pb2.FreezeRequest(frozen=True), timeout=10)
    try:
        call = engine.inference.Generate(request("beat-1", max_tokens=50), timeout=30)
        deadline = time.monotonic() + 10
        status = ALREADY_FINISHED
        while status != ABORTED and time.monotonic() < deadline:
            status = engine.abort("beat-1").status  # ALREADY_FINISHED until registered
        assert status == ABORTED
    finally:
        engine.admin.Freeze(admin_pb2.FreezeRequest(frozen=False), timeout=10)
    out = list(call)
    last = assert_one_terminal(out)
    assert last.finished.reason == g.FINISH_REASON_CANCELLED
    assert tokens_of(out) == [] and last.usage.completion_tokens == 0
    time.sleep(0.1)
    load = engine.load()
    assert (load.running_requests, load.queued_requests, load.used_kv_blocks) == (0, 0, 0)


def test_concurrent_abort_and_terminal_event_agree(engine: Engine):
    """Aborts racing the natural end: ABORTED <=> the stream ended CANCELLED."""

    async def one(stub, control, i: int, rng: random.Random):
        rid = f"race-{i}"
        call = stub.Generate(request(rid, max_tokens=4))
        out = []

        async def read():
            async for r in call:
                out.append(r)

        async with asyncio.TaskGroup() as tg:
            tg.create_task(read())
            # a 4-token request lasts ~45 ms at speedup 1: aborts spread over 0-200 ms land
            # both before and after its end, however fast or slow the machine is today
            await asyncio.sleep(rng.uniform(0.0, 0.2))
            ack = await control.Abort(lifecycle_pb2.AbortRequest(request_id=rid))
        return ack.status, assert_one_terminal(out).finished.reason

    async def main():
        rng = random.Random(7)
        async with grpc.aio.insecure_channel(engine.address) as ch:
            stub = openengine_pb2_grpc.InferenceStub(ch)
            control = openengine_pb2_grpc.ControlStub(ch)
            return await asyncio.gather(*(one(stub, control, i, rng) for i in range(40)))

    results = asyncio.run(main())
    for status, reason in results:
        assert (status == ABORTED) == (reason == g.FINISH_REASON_CANCELLED), results
        assert reason in (g.FINISH_REASON_CANCELLED, g.FINISH_REASON_LENGTH)
    statuses = {s for s, _ in results}
    assert statuses == {ABORTED, ALREADY_FINISHED}, "the race should go both ways"


# ----- grpc.health.v1 and admin -------------------------------------------------------------------


def test_all_health_services_are_serving(engine: Engine):
    health = health_pb2_grpc.HealthStub(engine.channel)
    for service in wc.HEALTH_SERVICES:
        resp = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert resp.status == SERVING, service
    with pytest.raises(grpc.RpcError) as info:
        health.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_admin_set_health_is_seen_by_check_and_watch(engine: Engine):
    health = health_pb2_grpc.HealthStub(engine.channel)
    watch = health.Watch(health_pb2.HealthCheckRequest(service=wc.HEALTH_INFERENCE), timeout=30)
    assert next(watch).status == SERVING
    admin = engine.admin
    try:
        admin.SetHealth(admin_pb2.SetHealthRequest(service="inference", status=NOT_SERVING))
        assert next(watch).status == NOT_SERVING
        check = health.Check(health_pb2.HealthCheckRequest(service="inference"), timeout=10)
        assert check.status == NOT_SERVING
        # liveness is independent
        check = health.Check(health_pb2.HealthCheckRequest(service="liveness"), timeout=10)
        assert check.status == SERVING
    finally:
        admin.SetHealth(admin_pb2.SetHealthRequest(service="inference", status=SERVING))
    assert next(watch).status == SERVING
    watch.cancel()
    with pytest.raises(grpc.RpcError) as info:
        admin.SetHealth(admin_pb2.SetHealthRequest(service="inference", status=99), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_admin_stall_tokens_holds_delivery_but_not_the_engine(engine: Engine):
    stall_s = 3.0
    engine.admin.StallTokens(admin_pb2.StallTokensRequest(seconds=stall_s), timeout=10)
    t0 = time.monotonic()
    out: list[g.GenerateResponse] = []
    reader = threading.Thread(
        target=lambda: out.extend(engine.generate(request("stall-a", max_tokens=3)))
    )
    reader.start()
    try:
        # The engine runs on while delivery is held: the request leaves the scheduler (all 3
        # tokens generated) long before the stall ends.
        saw_running = False
        while time.monotonic() - t0 < stall_s - 0.5:
            running = engine.load().running_requests
            saw_running = saw_running or running > 0
            if saw_running and running == 0:
                break
            time.sleep(0.01)
        else:
            pytest.fail("the engine did not finish the request while token delivery was held")
        assert not out  # nothing delivered yet
    finally:
        reader.join(timeout=30)
    assert time.monotonic() - t0 >= stall_s - 0.1
    assert assert_one_terminal(out).finished.reason == g.FINISH_REASON_LENGTH
    # ... and then each engine step still arrives as its own TokenOutput (never merged)
    assert [len(m.token.tokens) for m in out[:-1]] == [1, 1, 1]


def test_admin_freeze_stops_the_engine_loop_and_its_load_clock(engine: Engine):
    engine.admin.Freeze(admin_pb2.FreezeRequest(frozen=True), timeout=10)
    got: list[g.GenerateResponse] = []
    try:
        call = engine.inference.Generate(request("freeze-1", max_tokens=3), timeout=30)
        reader = threading.Thread(target=lambda: got.extend(call), daemon=True)
        reader.start()
        stamp = engine.load().timestamp_unix_nanos
        time.sleep(0.5)
        assert got == []  # no pass ran
        assert engine.load().timestamp_unix_nanos == stamp  # the load sample goes stale
    finally:
        engine.admin.Freeze(admin_pb2.FreezeRequest(frozen=False), timeout=10)
    reader.join(10)
    assert assert_one_terminal(got).finished.reason == g.FINISH_REASON_LENGTH
    assert engine.load().timestamp_unix_nanos > stamp


def test_dropping_the_stream_cancels_the_engine_work(engine: Engine):
    call, _ = start(engine, request("drop-1", max_tokens=2000))
    assert engine.load().running_requests == 1
    call.cancel()
    deadline = time.monotonic() + 5
    while engine.load().running_requests and time.monotonic() < deadline:
        time.sleep(0.02)
    load = engine.load()
    assert load.running_requests == 0 and load.used_kv_blocks == 0
    assert engine.abort("drop-1").status == ALREADY_FINISHED
