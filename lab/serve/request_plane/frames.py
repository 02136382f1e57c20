"""Request-plane framing: a 9-byte header `!BII` (frame type, stream id, payload length), then the
payload (orjson bytes; empty for CANCEL). Many streams are multiplexed on one connection; stream
ids are chosen by the client, per connection."""

from __future__ import annotations

import struct
from enum import IntEnum

from lab.serve.request_plane.payloads import EndPayload, end_payload

HEADER = struct.Struct("!BII")
HEADER_SIZE = HEADER.size  # 9
MAX_PAYLOAD = 32 * 1024 * 1024
MAX_STREAM_ID = 0xFFFFFFFF


class FrameType(IntEnum):
    REQUEST = 1  # frontend -> sidecar, payload: the request dict
    CANCEL = 2  # frontend -> sidecar, empty payload: the client went away
    CHUNK = 3  # sidecar -> frontend: {"t": [...], "lp": [...]?, "top": [...]?}
    END = 4  # sidecar -> frontend, exactly one per stream, last


_VALID_TYPES = frozenset(int(t) for t in FrameType)


class FrameError(ValueError):
    """The peer sent bytes that are not a valid frame; the connection is closed."""


def encode_frame(ftype: int, stream_id: int, payload: bytes = b"") -> bytes:
    if len(payload) > MAX_PAYLOAD:
        raise FrameError(f"frame payload of {len(payload)} bytes exceeds {MAX_PAYLOAD}")
    return HEADER.pack(ftype, stream_id, len(payload)) + payload


class FrameReader:
    """Incremental decoder: feed() bytes as they arrive, get back the complete frames."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, int, bytes]]:
        buf = self._buf
        buf += data
        frames: list[tuple[int, int, bytes]] = []
        pos = 0
        end = len(buf)
        unpack = HEADER.unpack_from
        while end - pos >= HEADER_SIZE:
            ftype, sid, length = unpack(buf, pos)
            if ftype not in _VALID_TYPES:
                raise FrameError(f"unknown frame type {ftype}")
            if length > MAX_PAYLOAD:
                raise FrameError(f"frame payload of {length} bytes exceeds {MAX_PAYLOAD}")
            stop = pos + HEADER_SIZE + length
            if stop > end:
                break
            frames.append((ftype, sid, bytes(buf[pos + HEADER_SIZE : stop])))
            pos = stop
        if pos:
            del buf[:pos]
        return frames


def error_end(kind: str, message: str, status: int, worker_id: str | None = None) -> EndPayload:
    """An END payload carrying an error (docs/request-plane.md, "EndPayload")."""
    return end_payload(
        error={"kind": kind, "message": message, "status": status}, worker_id=worker_id
    )
