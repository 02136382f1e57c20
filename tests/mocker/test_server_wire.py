"""Unit checks of the server's hand-encoded token events and handoff stamp (no sockets)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lab.wire import constants as wc
from lab.wire.gen.openengine.v1 import generation_pb2 as g
from mocker.server.fastwire import response_prefix, token_event, varint, warm
from mocker.server.handoff import stamp_session, validate_session
from mocker.server.tokens_out import Candidates


def reference_event(request_id: str, tokens: list[int]) -> g.GenerateResponse:
    infos = [g.TokenInfo(token_id=t, token=f"<token:{t}>") for t in tokens]
    return g.GenerateResponse(
        request_id=request_id,
        token=g.TokenOutput(output_index=0, tokens=infos, text="".join(i.token for i in infos)),
    )


@given(
    request_id=st.text(max_size=300),
    tokens=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=300),
)
def test_hand_encoded_token_events_parse_to_the_protobuf_message(request_id, tokens):
    raw = token_event(response_prefix(request_id), tokens)
    parsed = g.GenerateResponse.FromString(raw)
    assert parsed == reference_event(request_id, tokens)
    assert parsed.token.HasField("output_index")


@given(
    tokens=st.lists(
        st.one_of(st.integers(1000, 31999), st.integers(0, 2**32 - 1)), min_size=1, max_size=300
    ),
)
def test_warmed_token_events_parse_to_the_protobuf_message(tokens):
    """The flat-table fast path (ids in the warmed range) and its fallback agree with protobuf."""
    warm()
    raw = token_event(response_prefix("req-1"), tokens)
    assert g.GenerateResponse.FromString(raw) == reference_event("req-1", tokens)


def test_varint_matches_protobuf():
    for n in (0, 1, 127, 128, 300, 16383, 16384, 2**32 - 1):
        packed = varint(n)
        assert g.TokenIds(ids=[n]).SerializeToString() == b"\x0a" + varint(len(packed)) + packed


def test_a_stamped_session_validates_and_carries_the_first_token():
    s = stamp_session(seed=42, request_id="r", prompt_tokens=17, first_token=13661,
                      first_logprob=-0.2, kv_host="127.0.0.1", kv_port=5600)
    h = validate_session(s)
    assert (h.first_token, h.first_logprob, h.prompt_tokens) == (13661, -0.2, 17)
    assert s.attributes_struct.fields[wc.ATTR_TTFT_MS].number_value == 12.5
    no_lp = stamp_session(seed=42, request_id="r", prompt_tokens=17, first_token=1,
                          first_logprob=None, kv_host="h", kv_port=1)
    assert wc.ATTR_FIRST_GEN_LOG_PROBS not in no_lp.attributes_struct.fields
    assert validate_session(no_lp).first_logprob is None


@pytest.mark.parametrize(
    ("selection", "ids"),
    [
        (g.CandidateTokenSelection(top_n=3), [100, 101, 102]),
        (g.CandidateTokenSelection(top_n=50), list(range(100, 120))),  # capped at 20
        (g.CandidateTokenSelection(token_ids=g.TokenIds(ids=list(range(30)))), list(range(20))),
        (g.CandidateTokenSelection(all=g.AllCandidates()), list(range(100, 120))),
    ],
)
def test_candidate_selection_modes(selection, ids):
    cands = Candidates.parse(selection, True).build(100, -0.5)
    assert [c.token_id for c in cands] == ids
    assert [c.rank for c in cands] == list(range(1, len(ids) + 1))
    assert [c.logprob for c in cands] == pytest.approx([-0.5 - 0.1 * i for i in range(len(ids))])
    assert Candidates.parse(g.CandidateTokenSelection(), False) is None
