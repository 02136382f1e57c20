"""Prefill / decode roles over real sockets: role validation, PrefillReady and its stamped
session, the strict handoff validation (mutations a lossy relay makes), first-token replay with
its logprob, the bypassed-prefill path, and a prefill -> JSON -> decode round trip across two
server processes (docs/mocker.md "Handoff stamps and their validation")."""

from __future__ import annotations

import copy
import time

import grpc
import pytest

from lab.wire import constants as wc
from lab.wire.gen.openengine.v1 import generation_pb2 as g
from lab.wire.gen.openengine.v1 import kv_pb2, server_pb2
from mocker.engine import deterministic_token_id, stable_request_uuid, synthetic_logprob
from tests.mocker.test_server_support import (
    SEED,
    Engine,
    assert_one_terminal,
    attrs,
    engine_process,
    events,
    handoff_json,
    request,
    session_from_json,
    token_infos,
    tokens_of,
)

KV_PORT = 5611
#: decode waits prompt_tokens * 131072 B / (0.02 GB/s): 16 tokens -> ~105 ms
DECODE_BANDWIDTH_GBPS = 0.02


@pytest.fixture(scope="module")
def prefill(tmp_path_factory) -> Engine:
    with engine_process(
        tmp_path_factory.mktemp("prefill"), "engine-prefill",
        "--role", "prefill", "--speedup-ratio", "0", "--kv-port", str(KV_PORT),
    ) as e:
        yield e


@pytest.fixture(scope="module")
def decode(tmp_path_factory) -> Engine:
    with engine_process(
        tmp_path_factory.mktemp("decode"), "engine-decode",
        "--role", "decode", "--speedup-ratio", "1",
        "--engine-args", f'{{"kv_transfer_bandwidth": {DECODE_BANDWIDTH_GBPS}}}',
    ) as e:
        yield e


@pytest.fixture(scope="module")
def aggregated(tmp_path_factory) -> Engine:
    with engine_process(tmp_path_factory.mktemp("agg"), "engine-agg", "--speedup-ratio", "0") as e:
        yield e


def prefill_leg(prefill: Engine, rid: str, prompt=None, **kw) -> list[g.GenerateResponse]:
    return prefill.generate(request(rid, prompt, max_tokens=1, context_only=True, **kw))


def session_of(out: list[g.GenerateResponse]) -> kv_pb2.KvSessionRef:
    last = assert_one_terminal(out)
    assert last.WhichOneof("event") == "prefill_ready", events(out)
    return last.prefill_ready.kv_session


def relayed(prefill: Engine, rid: str, **kw) -> dict:
    """Run a prefill leg and return its handoff as the sidecars relay it (JSON)."""
    return handoff_json(session_of(prefill_leg(prefill, rid, **kw)))


# ----- prefill ---------------------------------------------------------------------------------


def test_prefill_stream_ends_with_prefill_ready_and_no_finished(prefill: Engine):
    out = prefill_leg(prefill, "p-1")
    assert events(out) == ["token", "prefill_ready"]
    first = deterministic_token_id(SEED, "p-1", 0)
    assert tokens_of(out) == [first]
    s = session_of(out)
    assert s.session_id == wc.MOCKER_SESSION_PREFIX + stable_request_uuid(SEED, "p-1")
    assert s.transfer_backend == "MOCKER" and s.dp_rank == 0
    assert [(e.host, e.port, e.protocol) for e in s.endpoints] == [("127.0.0.1", KV_PORT, "mocker")]
    f = s.attributes_struct.fields
    assert f[wc.ATTR_REQUEST_ID].string_value == "p-1"
    assert f[wc.ATTR_PROMPT_TOKENS].number_value == 16.0
    assert f[wc.ATTR_TTFT_MS].number_value == 12.5
    assert [v.number_value for v in f[wc.ATTR_FIRST_GEN_TOKENS].list_value.values] == [first]
    assert wc.ATTR_FIRST_GEN_LOG_PROBS not in f  # output logprobs were not requested


def test_prefill_ready_carries_the_context_phases_usage(prefill: Engine):
    prompt = [7000 + i for i in range(40)]  # one full block, cached on the second run
    u = assert_one_terminal(prefill_leg(prefill, "pu-1", prompt)).usage
    assert (u.prompt_tokens, u.completion_tokens, u.total_tokens) == (40, 1, 41)
    assert u.HasField("cached_prompt_tokens") and u.cached_prompt_tokens == 0
    u = assert_one_terminal(prefill_leg(prefill, "pu-2", prompt)).usage
    assert u.cached_prompt_tokens == 32


def test_prefill_requires_a_single_token_budget(prefill: Engine):
    for max_tokens in (None, 0, 2):
        err = prefill.refusal(request("pb-1", max_tokens=max_tokens, context_only=True))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "exactly one token" in err.details()


def test_prefill_serves_a_context_leg_whose_min_tokens_exceeds_its_one_token(prefill: Engine):
    # Dynamo's TRT-LLM sidecar forwards the client's min_tokens on the prefill leg; the reference
    # mocker serves it (the one-token budget is returned before min_tokens is compared).
    out = prefill_leg(prefill, "pm-1", min_tokens=128)
    assert events(out) == ["token", "prefill_ready"]
    assert assert_one_terminal(out).usage.completion_tokens == 1


def test_disaggregated_roles_report_their_identity_and_sessions(prefill: Engine, decode: Engine):
    for engine, role in ((prefill, server_pb2.ENGINE_ROLE_PREFILL),
                         (decode, server_pb2.ENGINE_ROLE_DECODE)):
        info = engine.control.GetServerInfo(server_pb2.GetServerInfoRequest(), timeout=10)
        assert info.engine_role == role and info.kv_connector.enabled
        load = engine.load()
        assert load.HasField("active_kv_sessions") and load.active_kv_sessions == 0
    session = session_from_json(relayed(prefill, "sess-1"))
    call = decode.inference.Generate(request("sess-1", max_tokens=200, session=session), timeout=30)
    next(call)
    assert decode.load().active_kv_sessions == 1
    assert decode.abort("sess-1").status == 1
    list(call)
    assert decode.load().active_kv_sessions == 0


# ----- role validation ---------------------------------------------------------------------------


def test_role_validation_rejects_mismatched_disaggregation_payloads(
    prefill: Engine, decode: Engine, aggregated: Engine
):
    session = session_from_json(relayed(prefill, "rv-0"))
    mismatches = [
        (aggregated, request("rv-1", max_tokens=1, context_only=True)),
        (aggregated, request("rv-2", session=session)),
        (prefill, request("rv-3", max_tokens=1)),
        (prefill, request("rv-4", max_tokens=1, session=session)),
        (decode, request("rv-5", max_tokens=1, context_only=True)),
    ]
    for engine, req in mismatches:
        err = engine.refusal(req)
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, (req.request_id, err)
    # "generation_only" or any other request_type is not context_only
    req = request("rv-6", max_tokens=1)
    req.extra.update({wc.REQUEST_TYPE_KEY: "context_and_generation"})
    assert assert_one_terminal(aggregated.generate(req)).finished.reason == g.FINISH_REASON_LENGTH


def test_context_only_and_a_session_together_are_rejected(
    prefill: Engine, decode: Engine, aggregated: Engine
):
    session = session_from_json(relayed(prefill, "both-0"))
    for engine in (prefill, decode, aggregated):
        err = engine.refusal(request("both-1", max_tokens=1, context_only=True, session=session))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "cannot be both" in err.details()


# ----- decode ----------------------------------------------------------------------------------


def test_prefill_handoff_round_trips_through_a_decode_server(prefill: Engine, decode: Engine):
    """Two processes, a JSON codec in between (what the sidecars do)."""
    prompt = list(range(4000, 4016))
    pre = prefill_leg(prefill, "rt-1", prompt)
    first = tokens_of(pre)[0]
    handoff = handoff_json(session_of(pre))
    assert set(handoff) >= set(wc.HANDOFF_KEYS)
    t0 = time.monotonic()
    call = decode.inference.Generate(
        request("rt-1", prompt, max_tokens=6, session=session_from_json(handoff)), timeout=30
    )
    out = [next(call)]
    waited = time.monotonic() - t0
    out.extend(call)
    last = assert_one_terminal(out)
    assert last.finished.reason == g.FINISH_REASON_LENGTH
    toks = tokens_of(out)
    assert toks[0] == first
    assert toks == [deterministic_token_id(SEED, "rt-1", p) for p in range(6)]
    assert last.usage.completion_tokens == 6 and last.usage.prompt_tokens == 16
    # the simulated KV transfer: 16 tokens x 131072 B / 0.02 GB/s = 105 ms before the replay
    assert waited >= 0.09


def test_decode_replays_the_prefill_first_token(prefill: Engine, decode: Engine):
    handoff = relayed(prefill, "rp-1")
    handoff[wc.HANDOFF_ATTRIBUTES][wc.ATTR_FIRST_GEN_TOKENS] = [12345]
    out = decode.generate(request("rp-1", max_tokens=3, session=session_from_json(handoff)))
    assert tokens_of(out) == [12345, *(deterministic_token_id(SEED, "rp-1", p) for p in (1, 2))]
    # max_tokens 1: only the replayed token
    out = decode.generate(request("rp-2", max_tokens=1, session=session_from_json(handoff)))
    assert tokens_of(out) == [12345] and out[-1].finished.reason == g.FINISH_REASON_LENGTH


def test_a_decode_server_runs_a_request_that_bypassed_prefill(decode: Engine):
    out = decode.generate(request("bypass-1", max_tokens=4))
    last = assert_one_terminal(out)
    assert last.finished.reason == g.FINISH_REASON_LENGTH
    assert tokens_of(out) == [deterministic_token_id(SEED, "bypass-1", p) for p in range(4)]


def test_the_first_tokens_logprob_survives_only_if_the_context_phase_computed_it(
    prefill: Engine, decode: Engine
):
    with_lp = relayed(prefill, "flp-1", output_logprobs=True)
    lp = with_lp[wc.HANDOFF_ATTRIBUTES][wc.ATTR_FIRST_GEN_LOG_PROBS]
    first = with_lp[wc.HANDOFF_ATTRIBUTES][wc.ATTR_FIRST_GEN_TOKENS][0]
    assert lp == [pytest.approx(synthetic_logprob(int(first)))]
    infos = token_infos(
        decode.generate(request("flp-1", max_tokens=3, output_logprobs=True,
                                session=session_from_json(with_lp)))
    )
    assert infos[0].HasField("logprob") and infos[0].logprob == pytest.approx(lp[0])
    without = relayed(prefill, "flp-2")
    assert wc.ATTR_FIRST_GEN_LOG_PROBS not in without[wc.HANDOFF_ATTRIBUTES]
    infos = token_infos(
        decode.generate(request("flp-2", max_tokens=3, output_logprobs=True,
                                session=session_from_json(without)))
    )
    assert not infos[0].HasField("logprob")
    assert all(i.HasField("logprob") for i in infos[1:])


def test_the_replayed_logprob_is_the_one_the_handoff_carried(prefill: Engine, decode: Engine):
    handoff = relayed(prefill, "rlp-1", output_logprobs=True)
    handoff[wc.HANDOFF_ATTRIBUTES][wc.ATTR_FIRST_GEN_LOG_PROBS] = [-0.4242]
    infos = token_infos(
        decode.generate(request("rlp-1", max_tokens=2, output_logprobs=True,
                                session=session_from_json(handoff)))
    )
    assert infos[0].logprob == -0.4242


def test_a_token_repeated_after_the_replay_keeps_its_own_logprob(prefill: Engine, decode: Engine):
    handoff = relayed(prefill, "rep-1", output_logprobs=True)
    repeated = deterministic_token_id(SEED, "rep-1", 1)
    handoff[wc.HANDOFF_ATTRIBUTES][wc.ATTR_FIRST_GEN_TOKENS] = [repeated]
    handoff[wc.HANDOFF_ATTRIBUTES][wc.ATTR_FIRST_GEN_LOG_PROBS] = [-0.4242]
    infos = token_infos(
        decode.generate(request("rep-1", max_tokens=2, output_logprobs=True,
                                session=session_from_json(handoff)))
    )
    assert [i.token_id for i in infos] == [repeated, repeated]
    assert infos[0].logprob == -0.4242
    assert infos[1].logprob == pytest.approx(synthetic_logprob(repeated))


def test_prompt_candidates_are_honoured_without_output_candidates(
    prefill: Engine, decode: Engine
):
    session = session_from_json(relayed(prefill, "pcand-1"))
    out = decode.generate(
        request("pcand-1", max_tokens=2, output_logprobs=True, prompt_logprobs=True,
                prompt_top_n=3, session=session)
    )
    assert events(out)[0] == "prompt"
    for t in out[0].prompt.tokens:
        assert [c.token_id for c in t.candidates] == [t.token_id + i for i in range(3)]
    assert all(not i.candidates for i in token_infos(out))


def _drop(key):
    return lambda h: h.pop(key)


def _attr(key, value):
    def mutate(h):
        h[wc.HANDOFF_ATTRIBUTES][key] = value

    return mutate


def _drop_attr(key):
    return lambda h: h[wc.HANDOFF_ATTRIBUTES].pop(key)


def _endpoint(key, value):
    def mutate(h):
        h[wc.HANDOFF_ENDPOINTS][0][key] = value

    return mutate


MUTATIONS = {
    "dropped attribute": (_drop_attr(wc.ATTR_REQUEST_ID), wc.ATTR_REQUEST_ID),
    "dropped ttft attribute": (_drop_attr(wc.ATTR_TTFT_MS), wc.ATTR_TTFT_MS),
    "dropped attributes": (_drop(wc.HANDOFF_ATTRIBUTES), "attributes_struct"),
    "defaulted string request id": (_attr(wc.ATTR_REQUEST_ID, ""), wc.ATTR_REQUEST_ID),
    "string coerced to number": (_attr(wc.ATTR_REQUEST_ID, 7), wc.ATTR_REQUEST_ID),
    "rounded fractional 12.0": (_attr(wc.ATTR_TTFT_MS, 12.0), wc.ATTR_TTFT_MS),
    "number coerced to string": (_attr(wc.ATTR_PROMPT_TOKENS, "16"), wc.ATTR_PROMPT_TOKENS),
    "fractional prompt tokens": (_attr(wc.ATTR_PROMPT_TOKENS, 16.5), wc.ATTR_PROMPT_TOKENS),
    "flattened list": (_attr(wc.ATTR_FIRST_GEN_TOKENS, 13661), wc.ATTR_FIRST_GEN_TOKENS),
    "empty list": (_attr(wc.ATTR_FIRST_GEN_TOKENS, []), wc.ATTR_FIRST_GEN_TOKENS),
    "fractional token id 13661.7": (_attr(wc.ATTR_FIRST_GEN_TOKENS, [13661.7]),
                                    wc.ATTR_FIRST_GEN_TOKENS),
    "out-of-range token id 1e20": (_attr(wc.ATTR_FIRST_GEN_TOKENS, [1e20]),
                                   wc.ATTR_FIRST_GEN_TOKENS),
    "negative token id": (_attr(wc.ATTR_FIRST_GEN_TOKENS, [-1]), wc.ATTR_FIRST_GEN_TOKENS),
    "defaulted string backend NIXL": (lambda h: h.update(transfer_backend="NIXL"),
                                      "transfer_backend"),
    "foreign session id": (lambda h: h.update(session_id="1234"), "session_id"),
    "dropped repeated endpoints": (_drop(wc.HANDOFF_ENDPOINTS), "endpoints"),
    "doubled endpoints": (lambda h: h[wc.HANDOFF_ENDPOINTS].append(h[wc.HANDOFF_ENDPOINTS][0]),
                          "endpoints"),
    "defaulted number port 0": (_endpoint("port", 0), "port"),
    "empty host": (_endpoint("host", ""), "host"),
    "other protocol": (_endpoint("protocol", "nixl"), "protocol"),
    "altered scalar dp_rank 3": (lambda h: h.update(dp_rank=3), "dp_rank"),
}


@pytest.fixture(scope="module")
def pristine(prefill: Engine) -> dict:
    return relayed(prefill, "mangle-0", output_logprobs=True)


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_decode_rejects_a_handoff_the_sidecar_mangled(decode: Engine, pristine: dict, mutation):
    mutate, field = MUTATIONS[mutation]
    handoff = copy.deepcopy(pristine)
    mutate(handoff)
    err = decode.refusal(request("mangle-1", max_tokens=2, session=session_from_json(handoff)))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err
    assert field in err.details()


def test_decode_accepts_the_unmangled_handoff_and_a_bad_logprob_list_is_refused(
    decode: Engine, pristine: dict
):
    out = decode.generate(request("mangle-2", max_tokens=2, session=session_from_json(pristine)))
    assert out[-1].finished.reason == g.FINISH_REASON_LENGTH
    handoff = copy.deepcopy(pristine)
    handoff[wc.HANDOFF_ATTRIBUTES][wc.ATTR_FIRST_GEN_LOG_PROBS] = 0.5  # flattened
    err = decode.refusal(request("mangle-3", max_tokens=2, session=session_from_json(handoff)))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert wc.ATTR_FIRST_GEN_LOG_PROBS in err.details()
    # unknown extra attributes are accepted (rolling upgrades)
    handoff = copy.deepcopy(pristine)
    handoff[wc.HANDOFF_ATTRIBUTES]["something_new"] = {"a": 1}
    out = decode.generate(request("mangle-4", max_tokens=2, session=session_from_json(handoff)))
    assert out[-1].finished.reason == g.FINISH_REASON_LENGTH
    assert attrs(session_from_json(pristine))[wc.ATTR_TTFT_MS] == 12.5
