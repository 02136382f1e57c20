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

from mocker.engine import token_text

from .tokens_out import text_of

_CACHE_LIMIT = 65536
_pieces: dict[int, tuple[bytes, bytes]] = {}


def varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _piece(token_id: int) -> tuple[bytes, bytes]:
    """(the encoded `tokens` entry of TokenOutput, the token's UTF-8 text)."""
    p = _pieces.get(token_id)
    if p is None:
        text = text_of(token_id).encode()
        info = b"\x08" + varint(token_id) + b"\x12" + varint(len(text)) + text
        p = (b"\x12" + varint(len(info)) + info, text)
        if len(_pieces) < _CACHE_LIMIT:
            _pieces[token_id] = p
    return p


def warm(first: int = 1000, end: int = 32000) -> None:
    """Precompute the pieces of the deterministic token range [1000, 32000) (~0.1 s), so the
    stream never pays a first-sight encoding on the hot path."""
    for t in range(first, end):
        if t not in _pieces:
            text = token_text(t).encode()
            info = b"\x08" + varint(t) + b"\x12" + varint(len(text)) + text
            _pieces[t] = (b"\x12" + varint(len(info)) + info, text)


def response_prefix(request_id: str) -> bytes:
    """The request_id field, shared by every event of one stream."""
    rid = request_id.encode()
    return b"\x0a" + varint(len(rid)) + rid


def token_event(prefix: bytes, tokens: list[int]) -> bytes:
    """GenerateResponse{request_id, token: TokenOutput{output_index: 0, tokens, text}}."""
    get = _pieces.get
    if len(tokens) == 1:
        t = tokens[0]
        entry, text = get(t) or _piece(t)
        body = b"".join((b"\x08\x00", entry, b"\x1a", varint(len(text)), text))
    else:
        entries = []
        texts = []
        for t in tokens:
            entry, text = get(t) or _piece(t)
            entries.append(entry)
            texts.append(text)
        text = b"".join(texts)
        entries.append(b"\x1a")
        entries.append(varint(len(text)))
        entries.append(text)
        body = b"\x08\x00" + b"".join(entries)
    return b"".join((prefix, b"\x1a", varint(len(body)), body))
