"""Deterministic token ids, request UUIDs and synthetic logprobs (docs/mocker.md "Tokens").

One BLAKE3 hash per token: blake3(seed_le8 || request_id_utf8 || position_le8); the first 4
digest bytes read as a little-endian u32 x give token 1000 + x mod 31000 (ids in [1000, 31999]).
The seed||request_id prefix is hashed once and copied per position (`token_deriver`), so no
output plan is rebuilt per position.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from blake3 import blake3

TOKEN_ID_BASE = 1000
TOKEN_ID_SPAN = 31000
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")


def _prefix(seed: int, request_id: str) -> bytes:
    return _U64.pack(seed & 0xFFFFFFFFFFFFFFFF) + request_id.encode("utf-8")


def stable_request_uuid(seed: int, request_id: str) -> str:
    """RFC-4122 v4-shaped UUID string from BLAKE3(seed_le8 || request_id)[:16]."""
    b = bytearray(blake3(_prefix(seed, request_id)).digest()[:16])
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def deterministic_token_id(seed: int, request_id: str, position: int) -> int:
    """Output token at `position` (0-based) of request `request_id` under `seed`."""
    d = blake3(_prefix(seed, request_id) + _U64.pack(position)).digest(4)
    return TOKEN_ID_BASE + int.from_bytes(d, "little") % TOKEN_ID_SPAN


def token_deriver(seed: int, request_id: str) -> Callable[[int], int]:
    """A `position -> token id` function equal to `deterministic_token_id(seed, request_id, .)`,
    with the seed/request-id prefix absorbed into the hasher once.

    It also has a `many(first, count)` attribute: the tokens of positions first..first+count-1
    (still one hash per token, in a tight loop; the scheduler's fast-forward uses it).
    """
    copy = blake3(_prefix(seed, request_id)).copy
    pack = _U64.pack
    unpack = _U32.unpack

    def token_at(position: int) -> int:
        h = copy()
        h.update(pack(position))
        return TOKEN_ID_BASE + unpack(h.digest(4))[0] % TOKEN_ID_SPAN

    def many(first: int, count: int) -> list[int]:
        out: list[int] = []
        append = out.append
        for position in range(first, first + count):
            h = copy()
            h.update(pack(position))
            append(TOKEN_ID_BASE + unpack(h.digest(4))[0] % TOKEN_ID_SPAN)
        return out

    token_at.many = many  # type: ignore[attr-defined]
    return token_at


def synthetic_logprob(token_id: int) -> float:
    """The reference's synthetic logprob: -0.1 * ((token_id mod 10) + 1)."""
    return -0.1 * ((token_id % 10) + 1)


def token_text(token_id: int) -> str:
    """The reference's token text `<token:ID>`."""
    return f"<token:{token_id}>"
