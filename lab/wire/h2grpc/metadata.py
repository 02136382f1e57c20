"""gRPC custom metadata <-> HTTP/2 header fields (binary `-bin` keys are base64 on the wire)."""

from __future__ import annotations

import base64
from collections.abc import Sequence

MetadataPairs = Sequence[tuple[str, str | bytes]]

#: Header fields gRPC reserves for itself: never shown to applications as metadata.
_RESERVED = frozenset(
    {
        b"te",
        b"content-type",
        b"user-agent",
        b"grpc-timeout",
        b"grpc-encoding",
        b"grpc-accept-encoding",
        b"grpc-status",
        b"grpc-message",
        b"grpc-status-details-bin",
    }
)


def to_fields(metadata: MetadataPairs | None) -> list[tuple[bytes, bytes]]:
    out = []
    for key, value in metadata or ():
        k = key.lower().encode()
        if k.endswith(b"-bin"):
            raw = value if isinstance(value, bytes) else value.encode()
            out.append((k, base64.b64encode(raw).rstrip(b"=")))
        else:
            out.append((k, value.encode() if isinstance(value, str) else value))
    return out


def from_fields(headers: list[tuple[bytes, bytes]]) -> tuple[tuple[str, str | bytes], ...]:
    out: list[tuple[str, str | bytes]] = []
    for k, v in headers:
        if k.startswith(b":") or k in _RESERVED:
            continue
        key = k.decode("latin-1")
        if key.endswith("-bin"):
            out.append((key, base64.b64decode(v + b"=" * (-len(v) % 4))))
        else:
            out.append((key, v.decode("latin-1")))
    return tuple(out)
