"""Messages survive bytes, and the bytes are the openengine v0.1.0 wire format."""

from __future__ import annotations

from google.protobuf import struct_pb2

from lab.wire import constants as c
from lab.wire.gen.loadlab.mocker.v1 import admin_pb2
from lab.wire.gen.openengine.v1 import (
    error_pb2,
    generation_pb2,
    kv_pb2,
    openengine_pb2,
)


def _handoff_session() -> kv_pb2.KvSessionRef:
    attrs = struct_pb2.Struct()
    attrs.update(
        {
            c.ATTR_REQUEST_ID: "r-1",
            c.ATTR_PROMPT_TOKENS: 136.0,
            c.ATTR_TTFT_MS: c.MOCKER_TTFT_MS,
            c.ATTR_FIRST_GEN_TOKENS: [4242.0],
        }
    )
    return kv_pb2.KvSessionRef(
        session_id=c.MOCKER_SESSION_PREFIX + "abc",
        transfer_backend=c.MOCKER_TRANSFER_BACKEND,
        endpoints=[kv_pb2.KvEndpoint(host="127.0.0.1", port=5600, protocol=c.MOCKER_KV_PROTOCOL)],
        dp_rank=0,
        attributes_struct=attrs,
    )


def test_generate_request_round_trip() -> None:
    req = generation_pb2.GenerateRequest(
        request_id="req-1",
        model="mocker-model",
        token_ids=generation_pb2.TokenIds(ids=[1, 2, 3, 2**32 - 1]),
        sampling=generation_pb2.SamplingParams(temperature=0.0, seed=7),
        stopping=generation_pb2.StoppingOptions(
            max_tokens=16,
            min_tokens=0,
            conditions=[generation_pb2.StopCondition(stop_token_id=9)],
        ),
        response=generation_pb2.ResponseOptions(
            return_output_logprobs=True,
            output_candidates=generation_pb2.CandidateTokenSelection(top_n=2),
        ),
        kv=generation_pb2.KvOptions(session=_handoff_session()),
    )
    req.extra.update({c.DETOKENIZE_KEY: False})
    back = generation_pb2.GenerateRequest.FromString(req.SerializeToString())
    assert back == req
    assert back.WhichOneof("input") == "token_ids"
    # proto3 `optional`: an explicit zero keeps its presence; an unset field has none.
    assert back.sampling.HasField("temperature") and back.sampling.temperature == 0.0
    assert back.stopping.HasField("min_tokens")
    assert not back.sampling.HasField("top_p")
    assert back.response.output_candidates.WhichOneof("selection") == "top_n"
    assert back.kv.session.attributes_struct[c.ATTR_TTFT_MS] == 12.5
    assert back.extra[c.DETOKENIZE_KEY] is False


def test_generate_response_round_trip() -> None:
    token = generation_pb2.GenerateResponse(
        request_id="req-1",
        token=generation_pb2.TokenOutput(
            tokens=[
                generation_pb2.TokenInfo(
                    token_id=5,
                    logprob=-0.25,
                    candidates=[generation_pb2.LogProb(token_id=6, logprob=-1.5, rank=2)],
                )
            ]
        ),
    )
    finished = generation_pb2.GenerateResponse(
        request_id="req-1",
        finished=generation_pb2.GenerationFinished(
            reason=generation_pb2.FINISH_REASON_STOP,
            stop_match=generation_pb2.StopMatch(stop_token_id=9),
        ),
        usage=generation_pb2.Usage(
            prompt_tokens=3, completion_tokens=1, total_tokens=4, cached_prompt_tokens=0
        ),
    )
    error = generation_pb2.GenerateResponse(
        request_id="req-1",
        error=error_pb2.EngineError(code=error_pb2.ERROR_CODE_OVERLOADED, retryable=True),
    )
    ready = generation_pb2.GenerateResponse(
        prefill_ready=generation_pb2.PrefillReady(kv_session=_handoff_session())
    )
    for msg in (token, finished, error, ready):
        back = generation_pb2.GenerateResponse.FromString(msg.SerializeToString())
        assert back == msg
        assert back.WhichOneof("event") == msg.WhichOneof("event")
    back = generation_pb2.GenerateResponse.FromString(finished.SerializeToString())
    assert back.usage.HasField("cached_prompt_tokens")
    assert not back.usage.HasField("reasoning_tokens")


def test_known_wire_bytes() -> None:
    """Hand-encoded bytes, independent of the descriptors: field numbers and wire types."""
    # usage = field 10, length-delimited (tag 0x52); prompt_tokens = field 1 varint.
    resp = generation_pb2.GenerateResponse(
        request_id="a", usage=generation_pb2.Usage(prompt_tokens=3)
    )
    assert resp.SerializeToString() == b"\x0a\x01a" + b"\x52\x02\x08\x03"
    # token_ids = field 4 (TokenIds), ids packed uint32.
    req = generation_pb2.GenerateRequest(token_ids=generation_pb2.TokenIds(ids=[1, 300]))
    assert req.SerializeToString() == b"\x22\x05\x0a\x03\x01\xac\x02"
    # KvEvent.block_stored = field 10 inside the `event` oneof.
    ev = kv_pb2.KvEvent(block_stored=kv_pb2.BlockStored(block_size=32))
    assert ev.SerializeToString() == b"\x52\x02\x20\x20"


def test_service_and_admin_names() -> None:
    services = openengine_pb2.DESCRIPTOR.services_by_name
    assert services["Inference"].full_name == c.INFERENCE_SERVICE
    assert services["Control"].full_name == c.CONTROL_SERVICE
    assert admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name == c.ADMIN_SERVICE
    session_fields = set(kv_pb2.KvSessionRef.DESCRIPTOR.fields_by_name)
    assert set(c.HANDOFF_KEYS) - session_fields == {c.HANDOFF_ATTRIBUTES}
