"""gRPC length-prefixed message reassembly across DATA frames (shared by server and client)."""

from __future__ import annotations

from collections.abc import Callable

from .frames import MESSAGE_PREFIX

_unpack_prefix = MESSAGE_PREFIX.unpack_from


class MessageError(Exception):
    """A compressed or oversized message: the call fails with `status` (a grpc.StatusCode
    name)."""

    def __init__(self, status: str, details: str) -> None:
        super().__init__(details)
        self.status = status
        self.details = details


def split_messages(
    partial: bytearray | None, payload: bytes, emit: Callable[[bytes], object], limit: int
) -> bytearray | None:
    """Emit every whole message of `partial + payload`; return the incomplete tail (None if
    none).

    The common case (no tail, whole messages in one frame) slices `payload` directly; a tail
    grows in place in a bytearray, so a large message spread over many frames is copied O(n)."""
    if partial:
        partial += payload
        data: bytes | bytearray = partial
    else:
        data = payload
    pos = 0
    n = len(data)
    while n - pos >= 5:
        compressed, length = _unpack_prefix(data, pos)
        if compressed:
            raise MessageError("INTERNAL", "compressed messages are not supported")
        if length > limit >= 0:
            raise MessageError(
                "RESOURCE_EXHAUSTED",
                f"Received message larger than max ({length} vs. {limit})",
            )
        end = pos + 5 + length
        if end > n:
            break
        emit(bytes(data[pos + 5 : end]) if partial else data[pos + 5 : end])  # type: ignore[arg-type]
        pos = end
    if pos >= n:
        return None
    if partial:
        del partial[:pos]
        return partial
    return bytearray(data[pos:])
