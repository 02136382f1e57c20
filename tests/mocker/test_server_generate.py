"""Generate on an aggregated mocker over a real socket: validation statuses, stream shape,
logprobs, stop tokens, clamping, capacity rejection, recorder (docs/mocker.md)."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from lab.wire.gen.openengine.v1 import error_pb2, model_pb2, server_pb2
from lab.wire.gen.openengine.v1 import generation_pb2 as g
from mocker.engine import deterministic_token_id, synthetic_logprob
from mocker.server.recorder import list_recorded
from tests.mocker.test_server_support import (
    SEED,
    Engine,
    assert_one_terminal,
    engine_process,
    events,
    request,
    token_infos,
    tokens_of,
)

SLOW_BLOCKS = 64  # x 32 tokens = a 2048-token KV pool


@pytest.fixture(scope="module")
def fast(tmp_path_factory) -> Engine:
    log_dir = tmp_path_factory.mktemp("fast")
    with engine_process(log_dir, "engine-fast", "--speedup-ratio", "0") as e:
        yield e


@pytest.fixture(scope="module")
def slow(tmp_path_factory) -> Engine:
    """Real-time engine (tokens every few ms) with a small KV pool, 3 permits, recording on."""
    with engine_process(
        tmp_path_factory.mktemp("slow"),
        "engine-slow",
        "--speedup-ratio", "1",
        "--max-concurrent-requests", "3",
        "--record-requests",
        "--instance-id", "engine-slow-0-abcd1234",
        "--engine-args", f'{{"num_gpu_blocks": {SLOW_BLOCKS}}}',
    ) as e:
        yield e


def expected_tokens(request_id: str, n: int, start: int = 0) -> list[int]:
    return [deterministic_token_id(SEED, request_id, p) for p in range(start, start + n)]


class Stream:
    """Consume a Generate stream in a thread (for requests that stay in flight)."""

    def __init__(self, engine: Engine, req: g.GenerateRequest) -> None:
        self.call = engine.inference.Generate(req, timeout=60)
        self.responses: list[g.GenerateResponse] = []
        self.error: grpc.RpcError | None = None
        self.first = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for r in self.call:
                self.responses.append(r)
                self.first.set()
        except grpc.RpcError as exc:
            self.error = exc
        self.first.set()

    def wait_first(self) -> None:
        assert self.first.wait(20)

    def join(self) -> list[g.GenerateResponse]:
        self.thread.join(30)
        assert not self.thread.is_alive()
        return self.responses


# ----- identity ------------------------------------------------------------------------------


def test_service_requires_a_trtllm_single_rank_aggregated_engine(fast: Engine):
    info = fast.control.GetServerInfo(server_pb2.GetServerInfoRequest(), timeout=10)
    assert info.engine_name == "tensorrt_llm"
    assert info.engine_role == server_pb2.ENGINE_ROLE_AGGREGATED
    assert info.instance_id == "dynamo-trtllm-mocker-aggregated"
    assert list(info.supported_models) == ["mocker-model"]
    p = info.parallelism
    assert (p.tensor_parallel_size, p.pipeline_parallel_size, p.data_parallel_size) == (1, 1, 1)
    assert p.data_parallel_rank == 0 and p.decode_context_parallel_size == 1
    kv = info.kv_connector
    assert kv.HasField("enabled") and not kv.enabled
    assert kv.transfer_backend == "MOCKER" and list(kv.supported_protocols) == ["mocker"]
    assert kv.supports_remote_prefill and not kv.supports_decode_pull
    assert kv.HasField("supports_abort_cleanup") and not kv.supports_abort_cleanup
    assert [(e.host, e.port, e.protocol) for e in kv.local_endpoints] == [
        ("127.0.0.1", 5600, "mocker")
    ]
    assert info.schema_revision == 1 and info.minimum_client_revision == 1
    cap = info.capacity
    assert (cap.kv_block_size, cap.total_kv_blocks) == (32, 16384)
    assert (cap.max_running_requests, cap.max_batched_tokens) == (256, 8192)


def test_control_reports_server_identity_and_load(slow: Engine):
    info = slow.control.GetServerInfo(server_pb2.GetServerInfoRequest(), timeout=10)
    assert info.instance_id == "engine-slow-0-abcd1234"
    assert info.capacity.total_kv_blocks == SLOW_BLOCKS
    idle = slow.load()
    assert idle.instance_id == "engine-slow-0-abcd1234"
    assert idle.running_requests == 0 and idle.queued_requests == 0
    assert idle.used_kv_blocks == 0 and idle.total_kv_blocks == SLOW_BLOCKS
    assert not idle.HasField("active_kv_sessions")  # only reported in P/D modes
    assert abs(idle.timestamp_unix_nanos - time.time_ns()) < 5e9
    s = Stream(slow, request("load-1", max_tokens=400))
    s.wait_first()
    busy = slow.load()
    assert busy.running_requests == 1
    assert busy.used_kv_blocks > 0
    assert slow.abort("load-1").status == 1
    s.join()


# ----- validation (gRPC statuses, nothing admitted) ------------------------------------------


def test_text_prompts_fail_with_an_actionable_status(fast: Engine):
    req = g.GenerateRequest(request_id="text-1", model="m", prompt="hello world")
    err = fast.refusal(req)
    assert err.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "token_ids" in err.details() and "is not simulated by the Mocker server" in err.details()


def test_missing_or_empty_input_is_invalid(fast: Engine):
    err = fast.refusal(g.GenerateRequest(request_id="noinput", model="m"))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    err = fast.refusal(request("empty-ids", prompt=[]))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "token_ids" in err.details()


def test_request_ids_must_be_non_empty_and_unique(fast: Engine, slow: Engine):
    err = fast.refusal(request(""))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "request_id" in err.details()
    err = fast.refusal(request("no-model", model=""))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "model" in err.details()
    first = Stream(slow, request("dup-1", max_tokens=400))
    first.wait_first()
    err = slow.refusal(request("dup-1", max_tokens=2))
    assert err.code() == grpc.StatusCode.ALREADY_EXISTS
    assert slow.abort("dup-1").status == 1
    assert first.join()[-1].finished.reason == g.FINISH_REASON_CANCELLED
    # once the first one is over, the id may be used again
    assert_one_terminal(slow.generate(request("dup-1", max_tokens=2)))


def test_validation_happens_in_the_reference_order(fast: Engine):
    # empty request_id beats an unsupported feature and a text prompt
    req = g.GenerateRequest(request_id="", model="m", prompt="x", lora_name="l")
    assert fast.refusal(req).code() == grpc.StatusCode.INVALID_ARGUMENT
    # an unsupported feature beats a text prompt
    req = g.GenerateRequest(request_id="o-1", model="m", prompt="x", lora_name="l")
    err = fast.refusal(req)
    assert err.code() == grpc.StatusCode.UNIMPLEMENTED and "LoRA" in err.details()
    # input beats max_tokens
    req = request("o-2", prompt=[], max_tokens=0)
    assert "token_ids" in fast.refusal(req).details()


UNSUPPORTED = {
    "media": lambda r: r.media.add(modality=g.MODALITY_IMAGE, url="http://x/y.png"),
    "lora": lambda r: setattr(r, "lora_name", "adapter-1"),
    "n>1": lambda r: setattr(r.sampling, "num_sequences", 2),
    "guided json_schema": lambda r: setattr(r.guided, "json_schema", "{}"),
    "guided json_object": lambda r: r.guided.json_object.SetInParent(),
    "guided backend only": lambda r: setattr(r.guided, "backend", "xgrammar"),
    "bypass_prefix_cache": lambda r: setattr(r.kv, "bypass_prefix_cache", True),
    "cache_salt": lambda r: setattr(r.kv, "cache_salt", "salt"),
}


@pytest.mark.parametrize("feature", list(UNSUPPORTED))
def test_unsupported_request_features_are_refused(fast: Engine, feature: str):
    req = request(f"unsup-{feature}")
    UNSUPPORTED[feature](req)
    err = fast.refusal(req)
    assert err.code() == grpc.StatusCode.UNIMPLEMENTED, err
    assert "is not simulated by the Mocker server" in err.details()


def test_supported_defaults_of_those_features_are_accepted(fast: Engine):
    req = request("sup-1", max_tokens=2)
    req.sampling.num_sequences = 1
    req.kv.bypass_prefix_cache = False
    req.kv.cache_salt = ""
    assert assert_one_terminal(fast.generate(req)).finished.reason == g.FINISH_REASON_LENGTH


def test_zero_max_tokens_is_rejected_rather_than_defaulted(fast: Engine):
    err = fast.refusal(request("zero-1", max_tokens=0))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "greater than zero" in err.details()
    # omitted max_tokens defaults to 20
    out = fast.generate(request("omit-1", max_tokens=None))
    assert tokens_of(out) == expected_tokens("omit-1", 20)


def test_oversized_generation_is_rejected_before_token_planning(fast: Engine):
    err = fast.refusal(request("big-1", max_tokens=1_000_001))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "Mocker limit" in err.details()
    err = fast.refusal(request("minmax-1", max_tokens=3, min_tokens=4))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "min_tokens" in err.details()


def test_output_budget_is_clamped_to_the_remaining_context_window(fast: Engine):
    prompt = [1000 + (i % 30000) for i in range(32760)]
    out = fast.generate(request("clamp-1", prompt=prompt, max_tokens=20))
    last = assert_one_terminal(out)
    assert last.finished.reason == g.FINISH_REASON_LENGTH
    assert len(tokens_of(out)) == 8 and last.usage.completion_tokens == 8
    err = fast.refusal(request("clamp-2", prompt=[*prompt, *range(1000, 1008)], max_tokens=1))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "context length" in err.details()


def test_any_non_empty_model_name_is_served(fast: Engine):
    for name in ("mocker-model", "Qwen/Qwen3-0.6B", "x"):
        out = fast.generate(request(f"model-{name}", model=name, max_tokens=2))
        assert assert_one_terminal(out).finished.reason == g.FINISH_REASON_LENGTH
    info = fast.control.GetModelInfo(model_pb2.GetModelInfoRequest(model="anything"), timeout=10)
    assert info.max_context_length == 32768


# ----- stream shape ------------------------------------------------------------------------


def test_aggregated_stream_ends_with_exactly_one_finished_and_no_prompt_event(fast: Engine):
    out = fast.generate(request("shape-1", max_tokens=6))
    last = assert_one_terminal(out)
    assert "prompt" not in events(out)
    assert last.finished.reason == g.FINISH_REASON_LENGTH
    assert last.finished.HasField("output_index") and last.finished.output_index == 0
    assert tokens_of(out) == expected_tokens("shape-1", 6)
    for info in token_infos(out):
        assert info.token == f"<token:{info.token_id}>"
        assert not info.HasField("logprob") and not info.candidates
    for r in out:
        assert r.request_id == "shape-1"
        if r.HasField("token"):
            assert r.token.text == "".join(t.token for t in r.token.tokens)
    u = last.usage
    assert (u.prompt_tokens, u.completion_tokens, u.total_tokens) == (16, 6, 22)
    assert u.HasField("cached_prompt_tokens")


def test_every_streamed_token_carries_a_logprob_when_requested(fast: Engine):
    out = fast.generate(request("lp-1", max_tokens=8, output_logprobs=True, output_top_n=3))
    infos = token_infos(out)
    assert [i.token_id for i in infos] == expected_tokens("lp-1", 8)
    for info in infos:
        lp = synthetic_logprob(info.token_id)
        assert info.HasField("logprob") and info.logprob == pytest.approx(lp)
        assert info.rank == 1
        assert [c.token_id for c in info.candidates] == [info.token_id + i for i in range(3)]
        assert [c.rank for c in info.candidates] == [1, 2, 3]
        assert [c.logprob for c in info.candidates] == pytest.approx([lp, lp - 0.1, lp - 0.2])
    # logprobs without candidates
    infos = token_infos(fast.generate(request("lp-2", max_tokens=3, output_logprobs=True)))
    assert all(i.HasField("logprob") and not i.candidates for i in infos)


def test_prompt_logprobs_do_not_depend_on_the_output_flag(fast: Engine):
    prompt = list(range(2000, 2010))
    with_out = fast.generate(
        request("plp-1", prompt, max_tokens=2, prompt_logprobs=True, output_logprobs=True)
    )
    without = fast.generate(request("plp-2", prompt, max_tokens=2, prompt_logprobs=True))
    for out in (with_out, without):
        assert events(out)[0] == "prompt" and events(out).count("prompt") == 1
        assert_one_terminal(out)
        ptoks = out[0].prompt.tokens
        assert [t.token_id for t in ptoks] == prompt
        assert [t.logprob for t in ptoks] == pytest.approx([synthetic_logprob(t) for t in prompt])
    assert with_out[0].prompt == without[0].prompt
    assert not any(i.HasField("logprob") for i in token_infos(without))


def test_prompt_candidates_follow_the_prompt_selection(fast: Engine):
    out = fast.generate(request("pc-1", [3000, 3001], max_tokens=1, prompt_logprobs=True,
                                prompt_top_n=2))
    for t in out[0].prompt.tokens:
        assert [c.token_id for c in t.candidates] == [t.token_id, t.token_id + 1]


def test_streaming_survives_a_producer_that_outruns_a_stalled_consumer(fast: Engine):
    call = fast.inference.Generate(request("stall-1", max_tokens=3000), timeout=60)
    first = next(call)
    time.sleep(1.0)  # the engine runs ahead while nobody reads
    out = [first, *call]
    last = assert_one_terminal(out)
    assert last.finished.reason == g.FINISH_REASON_LENGTH
    assert tokens_of(out) == expected_tokens("stall-1", 3000)
    # never merged, even for a consumer that fell far behind: one TokenOutput per step
    assert [len(m.token.tokens) for m in out[:-1]] == [1] * 3000


# ----- stop tokens -------------------------------------------------------------------------


def _stop_case(request_id: str, position: int) -> int:
    toks = expected_tokens(request_id, position + 1)
    assert toks[position] not in toks[:position], "pick another request id"
    return toks[position]


def test_a_matched_stop_token_ends_the_request_with_stop_and_a_match(fast: Engine):
    stop = _stop_case("stop-1", 3)
    out = fast.generate(request("stop-1", max_tokens=10, stop_ids=(stop, 7)))
    last = assert_one_terminal(out)
    assert last.finished.reason == g.FINISH_REASON_STOP
    assert last.finished.stop_match.stop_token_id == stop
    assert tokens_of(out) == expected_tokens("stop-1", 3)  # the matched token is not streamed
    assert last.usage.completion_tokens == 3
    # at exactly min_tokens generated, the stop fires
    out = fast.generate(request("stop-1", max_tokens=10, min_tokens=3, stop_ids=(stop,)))
    assert out[-1].finished.reason == g.FINISH_REASON_STOP


def test_a_stop_token_below_min_tokens_does_not_fire(fast: Engine):
    stop = _stop_case("stop-2", 1)
    out = fast.generate(request("stop-2", max_tokens=5, min_tokens=5, stop_ids=(stop,)))
    last = assert_one_terminal(out)
    assert last.finished.reason == g.FINISH_REASON_LENGTH
    assert tokens_of(out) == expected_tokens("stop-2", 5)


def test_a_cache_hit_never_covers_the_whole_prompt(fast: Engine):
    prompt = [5000 + i for i in range(64)]  # exactly two full 32-token blocks
    cold = assert_one_terminal(fast.generate(request("cache-1", prompt, max_tokens=1)))
    warm = assert_one_terminal(fast.generate(request("cache-2", prompt, max_tokens=1)))
    assert cold.usage.cached_prompt_tokens == 0
    assert warm.usage.cached_prompt_tokens == 63


# ----- in-flight behaviours on the real-time engine -------------------------------------------


def test_concurrent_request_limit_rejects_an_extra_stream(slow: Engine):
    streams = [Stream(slow, request(f"limit-{i}", max_tokens=400)) for i in range(3)]
    for s in streams:
        s.wait_first()
    err = slow.refusal(request("limit-extra", max_tokens=1))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "concurrent request limit" in err.details()
    # the permit is checked before parsing: even an invalid request gets RESOURCE_EXHAUSTED
    assert slow.refusal(request("", max_tokens=0)).code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    for i, s in enumerate(streams):
        assert slow.abort(f"limit-{i}").status == 1
        s.join()
    assert_one_terminal(slow.generate(request("limit-after", max_tokens=1)))


def test_capacity_rejection_is_an_in_band_internal_error(slow: Engine):
    prompt = [1000 + i for i in range(SLOW_BLOCKS * 32 + 10)]  # the prompt alone fills the pool
    out = slow.generate(request("cap-1", prompt, max_tokens=5))
    last = assert_one_terminal(out)
    assert events(out) == ["error"]
    assert last.error.code == error_pb2.ERROR_CODE_INTERNAL
    assert not last.error.retryable
    assert last.error.message == "request exceeds the simulated KV-cache capacity"


def test_request_recording_is_disabled_by_default(fast: Engine):
    with pytest.raises(grpc.RpcError) as info:
        list_recorded(fast.channel)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_only_accepted_requests_are_recorded(slow: Engine):
    before = {r.request_id for r in list_recorded(slow.channel)}
    slow.refusal(request("rec-bad", max_tokens=0))
    slow.generate(request("rec-good", max_tokens=1))
    recorded = list_recorded(slow.channel)
    new = [r for r in recorded if r.request_id not in before]
    assert [r.request_id for r in new] == ["rec-good"]
    assert new[0].stopping.max_tokens == 1
