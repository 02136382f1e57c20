"""The prefill -> decode handoff: what a prefill server stamps and what a decode server accepts
(docs/mocker.md "Handoff stamps and their validation").

The four typed attributes are chosen to catch lossy relays (a JSON codec between the legs): a
string (dropped/defaulted fields), a whole-valued double (type coercion), the fractional double
12.5 (rounding) and a one-element list (flattening). Anything off is INVALID_ARGUMENT naming the
field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from google.protobuf import struct_pb2

from lab.wire import constants as wc
from mocker.engine import stable_request_uuid

from .errors import RequestRefused, invalid
from .pb import kv_pb2

U32_MAX = 0xFFFFFFFF
_FIELD = "kv.session"
_ATTR = f"{_FIELD}.attributes_struct"


@dataclass(frozen=True, slots=True)
class Handoff:
    """What a validated session carries for the decode leg."""

    first_token: int
    first_logprob: float | None
    prompt_tokens: int


def stamp_session(
    *,
    seed: int,
    request_id: str,
    prompt_tokens: int,
    first_token: int,
    first_logprob: float | None,
    kv_host: str,
    kv_port: int,
) -> kv_pb2.KvSessionRef:
    attrs = struct_pb2.Struct()
    attrs.update(
        {
            wc.ATTR_REQUEST_ID: request_id,
            wc.ATTR_PROMPT_TOKENS: float(prompt_tokens),
            wc.ATTR_TTFT_MS: wc.MOCKER_TTFT_MS,
            wc.ATTR_FIRST_GEN_TOKENS: [float(first_token)],
        }
    )
    if first_logprob is not None:
        attrs.update({wc.ATTR_FIRST_GEN_LOG_PROBS: [first_logprob]})
    return kv_pb2.KvSessionRef(
        session_id=wc.MOCKER_SESSION_PREFIX + stable_request_uuid(seed, request_id),
        transfer_backend=wc.MOCKER_TRANSFER_BACKEND,
        endpoints=[kv_pb2.KvEndpoint(host=kv_host, port=kv_port, protocol=wc.MOCKER_KV_PROTOCOL)],
        dp_rank=wc.MOCKER_DP_RANK,
        attributes_struct=attrs,
    )


def _number(attrs: struct_pb2.Struct, key: str) -> float:
    v = attrs.fields.get(key)
    if v is None:
        raise invalid(f"{_ATTR}.{key} is missing")
    if v.WhichOneof("kind") != "number_value":
        raise invalid(f"{_ATTR}.{key} must be a number, got {v.WhichOneof('kind')}")
    return v.number_value


def _whole(x: float, lo: float, hi: float) -> bool:
    return math.isfinite(x) and x == math.floor(x) and lo <= x <= hi


def _list(attrs: struct_pb2.Struct, key: str) -> list[struct_pb2.Value]:
    v = attrs.fields[key]
    if v.WhichOneof("kind") != "list_value":
        raise invalid(f"{_ATTR}.{key} must be a list, got {v.WhichOneof('kind')}")
    items = list(v.list_value.values)
    if not items:
        raise invalid(f"{_ATTR}.{key} must be a non-empty list")
    return items


def validate_session(session: kv_pb2.KvSessionRef) -> Handoff:
    """Validate a decode leg's KvSessionRef; raises RequestRefused (INVALID_ARGUMENT)."""
    if not session.session_id.startswith(wc.MOCKER_SESSION_PREFIX):
        raise invalid(
            f"{_FIELD}.session_id {session.session_id!r} was not issued by a Mocker prefill "
            f"server (expected the prefix {wc.MOCKER_SESSION_PREFIX!r})"
        )
    if session.transfer_backend != wc.MOCKER_TRANSFER_BACKEND:
        raise invalid(
            f"{_FIELD}.transfer_backend must be {wc.MOCKER_TRANSFER_BACKEND!r}, "
            f"got {session.transfer_backend!r}"
        )
    if len(session.endpoints) != 1:
        raise invalid(
            f"{_FIELD}.endpoints must hold exactly 1 endpoint, got {len(session.endpoints)}"
        )
    ep = session.endpoints[0]
    if ep.protocol != wc.MOCKER_KV_PROTOCOL:
        raise invalid(
            f"{_FIELD}.endpoints[0].protocol must be {wc.MOCKER_KV_PROTOCOL!r}, got {ep.protocol!r}"
        )
    if not ep.host:
        raise invalid(f"{_FIELD}.endpoints[0].host must be non-empty")
    if ep.port == 0:
        raise invalid(f"{_FIELD}.endpoints[0].port must be non-zero")
    if session.dp_rank != wc.MOCKER_DP_RANK:
        raise invalid(f"{_FIELD}.dp_rank must be {wc.MOCKER_DP_RANK}, got {session.dp_rank}")
    if not session.HasField("attributes_struct") or not session.attributes_struct.fields:
        raise invalid(f"{_ATTR} is missing (the handoff lost its attributes)")
    attrs = session.attributes_struct
    for key in wc.MOCKER_REQUIRED_ATTRIBUTES:
        if key not in attrs.fields:
            raise invalid(f"{_ATTR}.{key} is missing")

    rid = attrs.fields[wc.ATTR_REQUEST_ID]
    if rid.WhichOneof("kind") != "string_value" or not rid.string_value:
        raise invalid(f"{_ATTR}.{wc.ATTR_REQUEST_ID} must be a non-empty string")

    prompt_tokens = _number(attrs, wc.ATTR_PROMPT_TOKENS)
    if not _whole(prompt_tokens, 0, 2**53):
        raise invalid(
            f"{_ATTR}.{wc.ATTR_PROMPT_TOKENS} must be a whole non-negative number, "
            f"got {prompt_tokens!r}"
        )

    ttft = _number(attrs, wc.ATTR_TTFT_MS)
    if ttft != wc.MOCKER_TTFT_MS:
        raise invalid(
            f"{_ATTR}.{wc.ATTR_TTFT_MS} must be exactly {wc.MOCKER_TTFT_MS}, got {ttft!r} "
            "(a fractional number was rounded)"
        )

    tokens = _list(attrs, wc.ATTR_FIRST_GEN_TOKENS)
    ids: list[int] = []
    for i, item in enumerate(tokens):
        x = item.number_value if item.WhichOneof("kind") == "number_value" else None
        if x is None or not _whole(x, 0, U32_MAX):
            shown = x if x is not None else item.WhichOneof("kind")
            raise invalid(
                f"{_ATTR}.{wc.ATTR_FIRST_GEN_TOKENS}[{i}] must be a token id "
                f"(a whole number in 0..{U32_MAX}), got {shown!r}"
            )
        ids.append(int(x))

    logprob: float | None = None
    if wc.ATTR_FIRST_GEN_LOG_PROBS in attrs.fields:
        lps = _list(attrs, wc.ATTR_FIRST_GEN_LOG_PROBS)
        first = lps[0]
        if first.WhichOneof("kind") != "number_value" or not math.isfinite(first.number_value):
            raise invalid(f"{_ATTR}.{wc.ATTR_FIRST_GEN_LOG_PROBS}[0] must be a finite number")
        logprob = first.number_value

    return Handoff(first_token=ids[0], first_logprob=logprob, prompt_tokens=int(prompt_tokens))


__all__ = ["Handoff", "RequestRefused", "stamp_session", "validate_session"]
