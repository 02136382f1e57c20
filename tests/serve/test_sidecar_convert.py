"""Request/response conversion and the handoff codec (pure units)."""

from __future__ import annotations

import grpc
import orjson
import pytest

from lab.serve.handoff import HandoffError, session_from_json, session_to_json
from lab.serve.sidecar.convert import (
    EngineFacts,
    ProtocolError,
    RequestError,
    ResponseConverter,
    build_generate_request,
    engine_error,
    rpc_error,
)
from lab.wire.constants import HANDOFF_KEYS
from lab.wire.gen.openengine.v1 import error_pb2, generation_pb2, kv_pb2

AGG = EngineFacts(role="aggregated", model="mocker-model", context_length=1000)
PREFILL = EngineFacts(role="prefill", model="mocker-model", context_length=1000)
DECODE = EngineFacts(role="decode", model="mocker-model", context_length=1000)


def req(**kw) -> dict:
    base = {"request_id": "r-1", "model": "m", "token_ids": [5, 6, 7, 8]}
    base.update(kw)
    return base


def session() -> kv_pb2.KvSessionRef:
    s = kv_pb2.KvSessionRef(session_id="mocker-prefill-1", transfer_backend="MOCKER", dp_rank=0)
    s.endpoints.add(host="127.0.0.1", port=5600, protocol="mocker")
    s.attributes_struct.update(
        {
            "mocker_request_id": "r-1",
            "mocker_prompt_tokens": 4.0,
            "mocker_ttft_ms": 12.5,
            "mocker_first_gen_tokens": [42.0],
        }
    )
    return s


def handoff_json() -> dict:
    return orjson.loads(orjson.dumps(session_to_json(session())))


# -- request ------------------------------------------------------------------------------------


def test_basic_request_fields() -> None:
    greq, plan = build_generate_request(
        req(
            max_tokens=16,
            min_tokens=2,
            ignore_eos=True,
            stop_token_ids=[9, 3, 9, 1],
            temperature=0.5,
            top_p=0.9,
            top_k=40,
            seed=7,
        ),
        AGG,
    )
    assert greq.request_id == "r-1" and greq.model == "m"
    assert list(greq.token_ids.ids) == [5, 6, 7, 8]
    assert greq.stopping.max_tokens == 16 and greq.stopping.min_tokens == 2
    assert greq.stopping.ignore_eos is True
    assert [c.stop_token_id for c in greq.stopping.conditions] == [1, 3, 9]
    assert greq.sampling.temperature == 0.5 and greq.sampling.top_p == 0.9
    assert greq.sampling.top_k == 40 and greq.sampling.seed == 7
    assert greq.sampling.num_sequences == 1
    assert dict(greq.extra) == {"detokenize": False}
    assert not greq.HasField("response") and not greq.HasField("kv")
    assert plan.prompt_tokens == 4 and not plan.decode_leg


def test_derived_max_tokens_and_min_tokens_budget() -> None:
    greq, _ = build_generate_request(req(), AGG)
    assert greq.stopping.max_tokens == 1000 - 4
    assert not greq.stopping.HasField("min_tokens")
    tight = EngineFacts(role="aggregated", model="m", context_length=3)
    greq, _ = build_generate_request(req(), tight)
    assert greq.stopping.max_tokens == 1  # max(1, 3 - 4)
    capped = EngineFacts(role="aggregated", model="m", context_length=1000, max_output_tokens=50)
    assert build_generate_request(req(), capped)[0].stopping.max_tokens == 50
    with pytest.raises(RequestError, match="'min_tokens' 997 exceeds the output budget 996"):
        build_generate_request(req(min_tokens=997), AGG)
    # Explicit max_tokens is passed through (0 is a real value).
    assert build_generate_request(req(max_tokens=0), AGG)[0].stopping.HasField("max_tokens")


def test_sampling_edge_cases() -> None:
    for unset in (0, -1, None):
        greq, _ = build_generate_request(req(top_k=unset), AGG)
        assert not greq.sampling.HasField("top_k")
    with pytest.raises(RequestError, match="'top_k'"):
        build_generate_request(req(top_k=-5), AGG)
    with pytest.raises(RequestError, match="'seed'"):
        build_generate_request(req(seed=-1), AGG)
    with pytest.raises(RequestError, match="'temperature'"):
        build_generate_request(req(temperature="hot"), AGG)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("request_id", ""),
        ("token_ids", []),
        ("token_ids", [1, -2]),
        ("token_ids", "abc"),
        ("max_tokens", -1),
        ("ignore_eos", "yes"),
        ("stop_token_ids", [1.5]),
    ],
)
def test_bad_fields_are_named(field: str, value: object) -> None:
    with pytest.raises(RequestError, match=repr(field)):
        build_generate_request(req(**{field: value}), AGG)


def test_logprobs_options() -> None:
    greq, plan = build_generate_request(req(logprobs=True, top_logprobs=3), AGG)
    assert greq.response.return_output_logprobs is True
    assert greq.response.output_candidates.top_n == 3
    assert plan.want_logprobs and plan.top_n == 3
    greq, plan = build_generate_request(req(logprobs=True, top_logprobs=None), AGG)
    assert greq.response.output_candidates.top_n == 1  # max(1, n)
    assert plan.top_n == 0


def test_prefill_leg() -> None:
    greq, _ = build_generate_request(req(max_tokens=100, min_tokens=100, logprobs=True), PREFILL)
    assert greq.stopping.max_tokens == 1
    assert greq.stopping.min_tokens == 1
    assert greq.extra["request_type"] == "context_only"
    assert greq.extra["detokenize"] is False
    assert greq.response.return_output_logprobs is True  # forwarded to prefill too
    assert not greq.HasField("kv")


def test_decode_leg_rebuilds_the_session() -> None:
    greq, plan = build_generate_request(
        req(max_tokens=10, handoff=handoff_json(), prefill_cached_tokens=2), DECODE
    )
    assert greq.kv.session == session()
    assert "request_type" not in greq.extra
    assert plan.decode_leg and plan.prefill_cached_tokens == 2
    # Plain requests on a decode worker (prefill bypassed) are fine; a handoff elsewhere is not.
    assert not build_generate_request(req(), DECODE)[0].HasField("kv")
    with pytest.raises(RequestError, match="'handoff' sent to a aggregated worker"):
        build_generate_request(req(handoff=handoff_json()), AGG)


# -- handoff codec ------------------------------------------------------------------------------


def test_handoff_roundtrip_through_json_is_exact() -> None:
    data = handoff_json()
    assert set(data) == set(HANDOFF_KEYS)
    assert data["attributes"]["mocker_ttft_ms"] == 12.5
    assert session_from_json(data) == session()


@pytest.mark.parametrize("key", HANDOFF_KEYS)
def test_handoff_missing_key_names_itself(key: str) -> None:
    data = handoff_json()
    del data[key]
    with pytest.raises(HandoffError, match=f"handoff is missing '{key}'"):
        session_from_json(data)


def test_handoff_unknown_keys_are_tolerated_and_bad_types_named() -> None:
    data = {**handoff_json(), "future_field": {"x": 1}}
    assert session_from_json(data) == session()
    for key, bad in [
        ("session_id", 5),
        ("dp_rank", "zero"),
        ("dp_rank", -1),
        ("endpoints", {}),
        ("attributes", [1]),
    ]:
        with pytest.raises(HandoffError, match=key):
            session_from_json({**handoff_json(), key: bad})
    broken = handoff_json()
    del broken["endpoints"][0]["port"]
    with pytest.raises(HandoffError, match=r"endpoints\[0\].*'port'"):
        session_from_json(broken)
    with pytest.raises(HandoffError, match="JSON object"):
        session_from_json("mocker-prefill-1")


# -- response -----------------------------------------------------------------------------------


def token_event(
    *ids: int, logprob: bool = False, candidates: int = 0
) -> generation_pb2.TokenOutput:
    out = generation_pb2.TokenOutput(output_index=0)
    for i in ids:
        info = out.tokens.add(token_id=i)
        if logprob:
            info.logprob = -0.5
        for c in range(candidates):
            info.candidates.add(token_id=i + c, logprob=-0.5 - c)
    return out


def finished(
    reason: int, usage: tuple[int, int, int] | None = None, **match
) -> generation_pb2.GenerateResponse:
    msg = generation_pb2.GenerateResponse(
        request_id="r-1", finished=generation_pb2.GenerationFinished(output_index=0, reason=reason)
    )
    if match:
        msg.finished.stop_match.CopyFrom(generation_pb2.StopMatch(**match))
    if usage:
        msg.usage.prompt_tokens, msg.usage.completion_tokens, cached = usage
        msg.usage.cached_prompt_tokens = cached
    return msg


def test_tokens_become_chunks_with_logprobs() -> None:
    _, plan = build_generate_request(req(logprobs=True, top_logprobs=2), AGG)
    conv = ResponseConverter(plan, "aggregated", "sidecar-0")
    chunk = conv.token(token_event(11, 12, logprob=True, candidates=3))
    assert chunk == {
        "t": [11, 12],
        "lp": [-0.5, -0.5],
        "top": [[[11, -0.5], [12, -1.5]], [[12, -0.5], [13, -1.5]]],
    }
    _, plan = build_generate_request(req(), AGG)
    conv = ResponseConverter(plan, "aggregated", "sidecar-0")
    assert conv.token(token_event(11)) == {"t": [11]}
    assert conv.token(generation_pb2.TokenOutput(output_index=0, text="x")) is None
    with pytest.raises(ProtocolError, match="output_index"):
        conv.token(generation_pb2.TokenOutput(tokens=[generation_pb2.TokenInfo(token_id=1)]))


def test_finished_maps_reason_stop_match_and_usage() -> None:
    _, plan = build_generate_request(req(), AGG)
    conv = ResponseConverter(plan, "aggregated", "sidecar-0")
    conv.token(token_event(1, 2))
    held, end = conv.terminal(finished(1, (4, 2, 9), eos_token_id=2), "finished")
    assert held is None
    assert end == {
        "finish": "stop",
        "stop_reason": 2,
        "handoff": None,
        "error": None,
        "worker_id": "sidecar-0",
        "usage": {"prompt_tokens": 4, "completion_tokens": 2, "cached_tokens": 4},
    }
    _, end = conv.terminal(finished(2), "finished")
    assert end["finish"] == "length" and end["stop_reason"] is None
    assert end["usage"] == {"prompt_tokens": 4, "completion_tokens": 2, "cached_tokens": 0}
    assert conv.terminal(finished(3), "finished")[1]["finish"] == "cancelled"
    with pytest.raises(ProtocolError, match="UNSPECIFIED"):
        conv.terminal(finished(0), "finished")
    with pytest.raises(ProtocolError, match="unexpected prompt event"):
        conv.terminal(
            generation_pb2.GenerateResponse(prompt=generation_pb2.PromptOutput()), "prompt"
        )


def test_decode_leg_reports_the_prefill_cached_count() -> None:
    _, plan = build_generate_request(req(handoff=handoff_json(), prefill_cached_tokens=3), DECODE)
    conv = ResponseConverter(plan, "decode", "sidecar-decode-0")
    _, end = conv.terminal(finished(2, (4, 10, 4)), "finished")
    assert end["usage"]["cached_tokens"] == 3  # not the decode engine's ~100%


def test_prefill_ready_becomes_a_handoff_end() -> None:
    _, plan = build_generate_request(req(), PREFILL)
    conv = ResponseConverter(plan, "prefill", "sidecar-prefill-0")
    assert conv.token(token_event(42)) is None  # held
    msg = generation_pb2.GenerateResponse(
        prefill_ready=generation_pb2.PrefillReady(kv_session=session())
    )
    msg.usage.prompt_tokens, msg.usage.completion_tokens, msg.usage.cached_prompt_tokens = 4, 1, 2
    held, end = conv.terminal(msg, "prefill_ready")
    assert held is None
    assert end["finish"] == "length" and end["error"] is None
    assert end["usage"] == {"prompt_tokens": 4, "completion_tokens": 0, "cached_tokens": 2}
    assert end["handoff"] == handoff_json()


def test_prefill_other_endings() -> None:
    _, plan = build_generate_request(req(), PREFILL)
    conv = ResponseConverter(plan, "prefill", "p")
    conv.token(token_event(42))
    held, end = conv.terminal(finished(1, eos_token_id=42), "finished")  # EOS on the first token
    assert held == {"t": [42]} and end["finish"] == "stop"
    conv = ResponseConverter(plan, "prefill", "p")
    with pytest.raises(ProtocolError, match="disaggregation is not configured"):
        conv.terminal(finished(2), "finished")
    agg = ResponseConverter(build_generate_request(req(), AGG)[1], "aggregated", "a")
    with pytest.raises(ProtocolError, match="PrefillReady"):
        agg.terminal(
            generation_pb2.GenerateResponse(prefill_ready=generation_pb2.PrefillReady()),
            "prefill_ready",
        )


@pytest.mark.parametrize(
    ("code", "kind", "status", "hint"),
    [
        (error_pb2.ERROR_CODE_INVALID_ARGUMENT, "invalid_request", 400, None),
        (error_pb2.ERROR_CODE_UNSUPPORTED_FEATURE, "invalid_request", 400, None),
        (error_pb2.ERROR_CODE_ROLE_MISMATCH, "invalid_request", 400, "role"),
        (error_pb2.ERROR_CODE_OVERLOADED, "engine_error", 500, None),
        (error_pb2.ERROR_CODE_CANCELLED, "cancelled", 499, None),
        (error_pb2.ERROR_CODE_KV_SESSION_NOT_FOUND, "engine_error", 500, "handoff"),
        (error_pb2.ERROR_CODE_KV_TRANSFER_FAILED, "engine_error", 500, "handoff"),
        (error_pb2.ERROR_CODE_INTERNAL, "engine_error", 500, None),
    ],
)
def test_engine_error_mapping(code: int, kind: str, status: int, hint: str | None) -> None:
    err = engine_error(error_pb2.EngineError(code=code, message="details here", retryable=True))
    assert err["kind"] == kind and err["status"] == status
    assert "details here" in err["message"]
    assert error_pb2.ErrorCode.Name(code) in err["message"]
    if hint:
        assert "hint" in err["message"] and hint in err["message"]


@pytest.mark.parametrize(
    ("code", "kind", "status"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, "invalid_request", 400),
        (grpc.StatusCode.UNIMPLEMENTED, "invalid_request", 400),
        (grpc.StatusCode.FAILED_PRECONDITION, "invalid_request", 400),
        (grpc.StatusCode.ALREADY_EXISTS, "invalid_request", 400),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "retryable", 503),
        (grpc.StatusCode.UNAVAILABLE, "retryable", 503),
        (grpc.StatusCode.INTERNAL, "engine_error", 500),
    ],
)
def test_rpc_status_mapping(code: grpc.StatusCode, kind: str, status: int) -> None:
    err = rpc_error(code, "why")
    assert (err["kind"], err["status"]) == (kind, status)
    assert code.name in err["message"] and "why" in err["message"]
