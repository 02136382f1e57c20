"""Hand-encoded GenerateResponse{token: TokenOutput} bytes for the hot path.

Building and serializing protobuf objects costs ~6 us per streamed token in Python; a token
event without logprobs is a fixed byte pattern, so it is assembled from memoised per-token
pieces instead (Generate is registered with a pass-through response serializer; every other
event is serialized by protobuf). `tests/mocker/test_server_wire.py` checks that the bytes parse
to the message protobuf would have built.

    GenerateResponse: 1 request_id (string), 3 token (TokenOutput)
    TokenOutput:      1 output_index (optional uint32, always present = 0),
                      2 tokens (repeated TokenInfo), 3 text (string)
    TokenInfo:        1 token_id (uint32), 2 token (string)
"""

from __future__ import annotations

from .tokens_out import text_of

_CACHE_LIMIT = 65536
#: Ids below this get flat lookup tables (the deterministic range is [1000, 32000)).
TABLE_SIZE = 32000
_pieces: dict[int, tuple[bytes, bytes]] = {}
# Per-id encoded `tokens` entry and UTF-8 text, indexed by id (None until warmed): lets
# `token_event` assemble a whole event with two C-level joins and no per-token Python code.
_entry_of: list[bytes | None] = [None] * TABLE_SIZE
_text_of: list[bytes | None] = [None] * TABLE_SIZE
# Per-id encoded `token` field (tag, length, TokenOutput) of a one-token event: the event is
# then the stream's request_id prefix plus this, one concatenation per streamed token.
_single_of: list[bytes | None] = [None] * TABLE_SIZE


def varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _encode(token_id: int) -> tuple[bytes, bytes]:
    text = text_of(token_id).encode()
    info = b"\x08" + varint(token_id) + b"\x12" + varint(len(text)) + text
    return b"\x12" + varint(len(info)) + info, text


def _piece(token_id: int) -> tuple[bytes, bytes]:
    """(the encoded `tokens` entry of TokenOutput, the token's UTF-8 text)."""
    p = _pieces.get(token_id)
    if p is None:
        p = _encode(token_id)
        if len(_pieces) < _CACHE_LIMIT:
            _pieces[token_id] = p
        if token_id < TABLE_SIZE:
            _entry_of[token_id], _text_of[token_id] = p
    return p


def _token_field(entries: bytes, text: bytes) -> bytes:
    body = b"".join((b"\x08\x00", entries, b"\x1a", varint(len(text)), text))
    return b"".join((b"\x1a", varint(len(body)), body))


def warm(first: int = 1000, end: int = TABLE_SIZE) -> None:
    """Precompute the pieces of the deterministic token range [1000, 32000) (~0.2 s), so the
    stream never pays a first-sight encoding on the hot path."""
    for t in range(first, min(end, TABLE_SIZE)):
        if _entry_of[t] is None:
            _entry_of[t], _text_of[t] = _encode(t)
        if _single_of[t] is None:
            _single_of[t] = _token_field(_entry_of[t], _text_of[t])  # type: ignore[arg-type]


def response_prefix(request_id: str) -> bytes:
    """The request_id field, shared by every event of one stream."""
    rid = request_id.encode()
    return b"\x0a" + varint(len(rid)) + rid


def token_event(prefix: bytes, tokens: list[int]) -> bytes:
    """GenerateResponse{request_id, token: TokenOutput{output_index: 0, tokens, text}}.

    Token ids are uint32 (never negative). Fast path: every id is in the warmed tables; any
    other id (out of range, or not seen yet) takes the per-token path.
    """
    try:
        # An unwarmed id is None in the tables: join raises TypeError and the slow path runs.
        entries = b"".join(map(_entry_of.__getitem__, tokens))  # type: ignore[arg-type]
        text = b"".join(map(_text_of.__getitem__, tokens))  # type: ignore[arg-type]
    except (IndexError, TypeError):
        parts = [_piece(t) for t in tokens]
        entries = b"".join([e for e, _ in parts])
        text = b"".join([x for _, x in parts])
    return prefix + _token_field(entries, text)


def single_token_event(prefix: bytes, token_id: int) -> bytes:
    """`token_event(prefix, [token_id])`, from the warmed table when the id is in it."""
    if 0 <= token_id < TABLE_SIZE:
        tail = _single_of[token_id]
        if tail is not None:
            return prefix + tail
    return token_event(prefix, [token_id])
