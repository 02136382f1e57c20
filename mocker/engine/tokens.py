"""Deterministic token ids, request UUIDs and synthetic logprobs (docs/mocker.md "Tokens").

One BLAKE3 hash per token: blake3(seed_le8 || request_id_utf8 || position_le8); the first 4
digest bytes read as a little-endian u32 x pick `allowed[x mod len(allowed)]` from the table of
ids the engine may emit. The default table is [1000, 31999] (token 1000 + x mod 31000, the
reference's ids and the vocabulary of the frontend's default word tokenizer); with a model's
vocabulary it is every id of that vocabulary but its special tokens (`allowed_token_ids`; the
server builds it from `--tokenizer` / `--vocab-size`, the engine does no I/O).
The seed||request_id prefix is hashed once and copied per position (`token_deriver`), so no
output plan is rebuilt per position.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Collection, Sequence

from blake3 import blake3

TOKEN_ID_BASE = 1000
TOKEN_ID_SPAN = 31000
#: The ids emitted without a vocabulary: [1000, 31999].
DEFAULT_ALLOWED_IDS: tuple[int, ...] = tuple(range(TOKEN_ID_BASE, TOKEN_ID_BASE + TOKEN_ID_SPAN))
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


def allowed_token_ids(vocab_size: int, excluded: Collection[int] = ()) -> tuple[int, ...]:
    """The ids an engine of a `vocab_size` vocabulary emits: 0 .. vocab_size - 1 without
    `excluded` (its special tokens: BOS, EOS, pad, ...). ValueError when none is left."""
    if vocab_size <= 0:
        raise ValueError(f"vocabulary size must be > 0, got {vocab_size}")
    skip = set(excluded)
    table = tuple(i for i in range(vocab_size) if i not in skip)
    if not table:
        raise ValueError(f"no token id left of a {vocab_size}-token vocabulary "
                         "once its special tokens are excluded")
    return table


def deterministic_token_id(seed: int, request_id: str, position: int,
                           allowed: Sequence[int] = DEFAULT_ALLOWED_IDS) -> int:
    """Output token at `position` (0-based) of request `request_id` under `seed`."""
    d = blake3(_prefix(seed, request_id) + _U64.pack(position)).digest(4)
    return allowed[int.from_bytes(d, "little") % len(allowed)]


def token_deriver(seed: int, request_id: str,
                  allowed: Sequence[int] = DEFAULT_ALLOWED_IDS) -> Callable[[int], int]:
    """A `position -> token id` function equal to
    `deterministic_token_id(seed, request_id, ., allowed)`, with the seed/request-id prefix
    absorbed into the hasher once.

    It also has a `many(first, count)` attribute: the tokens of positions first..first+count-1
    (still one hash per token, in a tight loop; the scheduler's fast-forward uses it).
    """
    copy = blake3(_prefix(seed, request_id)).copy
    pack = _U64.pack
    unpack = _U32.unpack
    n = len(allowed)

    def token_at(position: int) -> int:
        h = copy()
        h.update(pack(position))
        return allowed[unpack(h.digest(4))[0] % n]

    def many(first: int, count: int) -> list[int]:
        out: list[int] = []
        append = out.append
        for position in range(first, first + count):
            h = copy()
            h.update(pack(position))
            append(allowed[unpack(h.digest(4))[0] % n])
        return out

    token_at.many = many  # type: ignore[attr-defined]
    return token_at


def synthetic_logprob(token_id: int) -> float:
    """The reference's synthetic logprob: -0.1 * ((token_id mod 10) + 1)."""
    return -0.1 * ((token_id % 10) + 1)


def token_text(token_id: int) -> str:
    """The reference's token text `<token:ID>`."""
    return f"<token:{token_id}>"
