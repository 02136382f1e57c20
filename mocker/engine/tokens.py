"""Deterministic token ids, request UUIDs and synthetic logprobs (docs/mocker.md "Tokens").

The token ids of a request are the words of one BLAKE3 output stream: the extendable output
of blake3(seed_le8 || request_id_utf8) in key-derivation mode (context TOKEN_CONTEXT), read as
little-endian u32 words; word p (bytes 4p .. 4p+3) is x for the token at position p, which is
`allowed[x mod len(allowed)]` from the table of ids the engine may emit. Any position can be
read on its own (`seek`; a decode leg re-derives from position 1), and `token_deriver` reads
TOKEN_BLOCK words per call, so the per-token cost is an index and a modulo, not a hash
(instruction counts in docs/token-path.md). The default table is [1000, 31999] (token
1000 + x mod 31000, the reference's id range and the vocabulary of the frontend's default word
tokenizer); with a model's vocabulary it is every id of that vocabulary but its special tokens
(`allowed_token_ids`; the server builds it from `--tokenizer` / `--vocab-size`, the engine
does no I/O).
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
#: BLAKE3 key-derivation context of the token stream (so its words are not the request UUID's
#: bytes, which come from the plain hash of the same input).
TOKEN_CONTEXT = "loadlab mocker token ids v1"
#: Tokens read from the output stream per `digest` call.
TOKEN_BLOCK = 64
_BLOCK_WORDS = struct.Struct(f"<{TOKEN_BLOCK}I")


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


def _token_stream(seed: int, request_id: str) -> blake3:
    """The hasher whose extendable output holds the request's token words."""
    return blake3(_prefix(seed, request_id), derive_key_context=TOKEN_CONTEXT)


def deterministic_token_id(seed: int, request_id: str, position: int,
                           allowed: Sequence[int] = DEFAULT_ALLOWED_IDS) -> int:
    """Output token at `position` (0-based) of request `request_id` under `seed`."""
    word = _token_stream(seed, request_id).digest(4, seek=4 * position)
    return allowed[int.from_bytes(word, "little") % len(allowed)]


def token_deriver(seed: int, request_id: str,
                  allowed: Sequence[int] = DEFAULT_ALLOWED_IDS) -> Callable[[int], int]:
    """A `position -> token id` function equal to
    `deterministic_token_id(seed, request_id, ., allowed)`, that reads the output stream a
    block of TOKEN_BLOCK tokens at a time (one `digest` call each) and keeps the last block.

    It also has a `many(first, count)` attribute: the tokens of positions first..first+count-1
    (a slice of the block when they are in it; the scheduler's fast-forward uses it).
    A request's positions come in order, so a block serves TOKEN_BLOCK of them.
    """
    digest = _token_stream(seed, request_id).digest
    words = _BLOCK_WORDS.unpack
    n = len(allowed)
    span = TOKEN_BLOCK
    stride = 4 * TOKEN_BLOCK
    base = -span  # first position of `block`
    block: list[int] = []

    def load(position: int) -> int:
        """Read the block holding `position`; its offset in the block."""
        nonlocal base, block
        base = position - position % span
        block = [allowed[x % n] for x in words(digest(stride, seek=4 * base))]
        return position - base

    def token_at(position: int) -> int:
        i = position - base
        if not 0 <= i < span:
            i = load(position)
        return block[i]

    def many(first: int, count: int) -> list[int]:
        i = first - base
        if i >= 0 and i + count <= span:
            return block[i:i + count]
        return [token_at(p) for p in range(first, first + count)]

    token_at.many = many  # type: ignore[attr-defined]
    return token_at


def synthetic_logprob(token_id: int) -> float:
    """The reference's synthetic logprob: -0.1 * ((token_id mod 10) + 1)."""
    return -0.1 * ((token_id % 10) + 1)


def token_text(token_id: int) -> str:
    """The reference's token text `<token:ID>`."""
    return f"<token:{token_id}>"


def with_reasoning_span(token_at: Callable[[int], int], span: int, marker: int
                        ) -> Callable[[int], int]:
    """`token_at` with the think-end `marker` at position `span`: positions before it are the
    reasoning span, after it the answer (docs/mocker.md "Reasoning spans"). Used only for a
    request with a span, so a request without one keeps the plain deriver's per-token cost.
    Keeps the `many` attribute of a `token_deriver`."""
    base_many = getattr(token_at, "many", None)

    def at(position: int) -> int:
        return marker if position == span else token_at(position)

    def many(first: int, count: int) -> list[int]:
        out = (base_many(first, count) if base_many is not None
               else [token_at(p) for p in range(first, first + count)])
        if first <= span < first + count:
            out = list(out)
            out[span - first] = marker
        return out

    at.many = many  # type: ignore[attr-defined]
    return at
