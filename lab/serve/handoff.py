"""The disaggregation handoff: KvSessionRef <-> JSON (docs/engine-contract.md, "Handoff between
legs").

    {"session_id": str, "transfer_backend": str,
     "endpoints": [{"host": str, "port": int, "protocol": str}, ...],
     "dp_rank": int, "attributes": {...}}     # attributes = KvSessionRef.attributes_struct as JSON

Decoding is strict about the five keys (a missing or mistyped one names itself in the error) and
tolerant of unknown keys (rolling upgrades). The JSON codec is deliberately in the path: it is
where real handoffs get mangled, and the decode engine's validation is what catches it.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format

from lab.wire.constants import (
    HANDOFF_ATTRIBUTES,
    HANDOFF_DP_RANK,
    HANDOFF_ENDPOINTS,
    HANDOFF_KEYS,
    HANDOFF_SESSION_ID,
    HANDOFF_TRANSFER_BACKEND,
)
from lab.wire.gen.openengine.v1 import kv_pb2

_U32 = 0xFFFFFFFF


class HandoffError(ValueError):
    """The handoff JSON is not a usable KvSessionRef (the message names the key)."""


def session_to_json(session: kv_pb2.KvSessionRef) -> dict[str, Any]:
    return {
        HANDOFF_SESSION_ID: session.session_id,
        HANDOFF_TRANSFER_BACKEND: session.transfer_backend,
        HANDOFF_ENDPOINTS: [
            {"host": e.host, "port": e.port, "protocol": e.protocol} for e in session.endpoints
        ],
        HANDOFF_DP_RANK: session.dp_rank,
        HANDOFF_ATTRIBUTES: json_format.MessageToDict(session.attributes_struct),
    }


def _uint(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise HandoffError(f"handoff {name!r} must be an integer, got {type(value).__name__}")
    if isinstance(value, float) and not value.is_integer():
        raise HandoffError(f"handoff {name!r} must be an integer, got {value!r}")
    if not 0 <= value <= _U32:
        raise HandoffError(f"handoff {name!r} out of range: {value!r}")
    return int(value)


def _str(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise HandoffError(f"handoff {name!r} must be a string, got {type(value).__name__}")
    return value


def session_from_json(data: Any) -> kv_pb2.KvSessionRef:
    """Rebuild the KvSessionRef; HandoffError naming the key on a missing or mistyped field."""
    if not isinstance(data, dict):
        raise HandoffError(f"handoff must be a JSON object, got {type(data).__name__}")
    for key in HANDOFF_KEYS:
        if key not in data:
            raise HandoffError(f"handoff is missing {key!r}")
    session = kv_pb2.KvSessionRef(
        session_id=_str(data[HANDOFF_SESSION_ID], HANDOFF_SESSION_ID),
        transfer_backend=_str(data[HANDOFF_TRANSFER_BACKEND], HANDOFF_TRANSFER_BACKEND),
        dp_rank=_uint(data[HANDOFF_DP_RANK], HANDOFF_DP_RANK),
    )
    endpoints = data[HANDOFF_ENDPOINTS]
    if not isinstance(endpoints, list):
        raise HandoffError(f"handoff {HANDOFF_ENDPOINTS!r} must be a list")
    for i, ep in enumerate(endpoints):
        where = f"{HANDOFF_ENDPOINTS}[{i}]"
        if not isinstance(ep, dict):
            raise HandoffError(f"handoff {where!r} must be an object")
        for key in ("host", "port", "protocol"):
            if key not in ep:
                raise HandoffError(f"handoff {where!r} is missing {key!r}")
        session.endpoints.add(
            host=_str(ep["host"], f"{where}.host"),
            port=_uint(ep["port"], f"{where}.port"),
            protocol=_str(ep["protocol"], f"{where}.protocol"),
        )
    attributes = data[HANDOFF_ATTRIBUTES]
    if not isinstance(attributes, dict):
        raise HandoffError(f"handoff {HANDOFF_ATTRIBUTES!r} must be an object")
    try:
        json_format.ParseDict(attributes, session.attributes_struct)
    except (json_format.ParseError, ValueError, TypeError) as exc:
        raise HandoffError(f"handoff {HANDOFF_ATTRIBUTES!r} is not a JSON object: {exc}") from exc
    return session
