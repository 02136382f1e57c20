"""Tokenizers of the frontend: a deterministic word tokenizer (default) and HuggingFace files.

The default `WordTokenizer` needs no model files and makes a synthetic prompt of N words exactly
N tokens, which is what a load lab wants:

* encode: split on whitespace; a word of the form `<token:N>` is token N; any other word is
  `1000 + (u32 little-endian of the first 4 bytes of blake3(word utf-8)) % 31000`, so ids fall in
  [1000, 32000) and the same word always gives the same id.
* decode: token N becomes the text `"<token:N> "` (note the trailing space), so decoding N tokens
  gives exactly N whitespace-separated words, and encoding that text gives the same N ids back.
* stop strings: a stop string that is exactly one word maps to that word's token id (it is sent
  to the engine as a stop token id); anything else cannot be expressed at token level and is
  rejected by the frontend (400 naming `stop`).

`HFTokenizer` loads a HuggingFace `tokenizer.json` with the `tokenizers` package (imported only
when used) through `lab.shared.hf_tokenizer`, the loader the workload uses too, so
`lab up --tokenizer DIR` and `lab sweep --tokenizer DIR` count prompt tokens the same way
(add_special_tokens=False; the frontend's --add-special-tokens encodes a prompt with them, a
BOS, as vLLM does), and the launched engines emit only ids of its vocabulary
(`mocker serve --tokenizer`). Its stop strings map when they encode to exactly one token.

A stream decodes through `stream_decoder()`, an incremental detokenizer like vLLM's: each chunk's
text is decode(context + new ids) minus decode(context), with a few previous tokens as context
(so a decoder that joins pieces renders a boundary as a one-shot decode would), and text ending
in U+FFFD (a byte-level token ending inside a UTF-8 character) is held back until a later token
completes the character; the end of the stream flushes what is left. A chunk whose text is held
back writes no event (its tokens reach the client with the next one; usage counts them).
An id outside the vocabulary decodes to no text, as the `tokenizers` decoder does (a real engine
never emits one; the launched mockers are given the same tokenizer).

A byte-level BPE (a `ByteLevel` decoder: GPT-2, Llama 3, Qwen, ...) decodes without the
`tokenizers` call: each id's bytes are looked up once (`byte_level_table`), a chunk is the join
of its ids' bytes, and `ByteLevelDecoder` feeds them to Python's incremental UTF-8 decoder
(`errors="replace"`, as the Rust decoder's `from_utf8_lossy`), so a chunk is decoded once, not
with its context twice. It holds back exactly where `IncrementalDecoder` does (text ending in
U+FFFD, or inside a character), so the events and their text are the same;
tests/serve/test_frontend_hf_tokenizer.py checks both against `tokenizers` on every id and on
random id runs. While nothing is held back, an ASCII chunk (most chunks are one token, and most
tokens ASCII) is its own text and skips the UTF-8 decoder (docs/token-path.md
"An ASCII chunk skips the UTF-8 decoder").
"""

from __future__ import annotations

import codecs
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import blake3

WORD_ID_BASE = 1000
WORD_ID_SPAN = 31000
_TOKEN_PREFIX = "<token:"


class Tokenizer(Protocol):
    name: str
    #: encode() runs without the GIL (HF `tokenizers`, in Rust): the frontend may run it in a
    #: thread, off its event loop, for a long prompt
    releases_gil: bool

    def encode(self, text: str, limit: int | None = None) -> list[int]:
        """Token ids of `text`. With `limit`, a text of more than `limit` tokens may return
        just limit + 1 of them (the caller rejects it; the cost stays proportional to the
        limit, not to the text)."""
        ...

    def decode(self, ids: list[int]) -> str:
        """Text of a run of tokens (one chunk); chunk texts concatenate to the whole output."""
        ...

    def stop_token_id(self, stop: str) -> int | None:
        """The token id a stop string maps to, or None when it is not exactly one token."""
        ...

    def stream_decoder(self) -> StreamDecoder:
        """A fresh incremental decoder for one stream (see the module docstring)."""
        ...


class StreamDecoder(Protocol):
    def step(self, ids: list[int]) -> str:
        """The text the stream may show after these ids ("" while it is held back)."""
        ...

    def flush(self) -> str:
        """The text still held back at the end of the stream."""
        ...


class _Stateless:
    """A stream decoder of a tokenizer whose tokens decode on their own (the word tokenizer)."""

    __slots__ = ("step",)

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.step = tokenizer.decode

    def flush(self) -> str:
        return ""


#: Previous tokens an incremental decode keeps as context (vLLM keeps 5).
INCREMENTAL_CONTEXT = 5
_REPLACEMENT = "\ufffd"


class IncrementalDecoder:
    """vLLM-style incremental detokenizer over any `decode(ids) -> str` (module docstring)."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._read = 0  # ids before this are shown; ids[:read] is the context

    def _delta(self) -> str:
        ids = self._ids
        context = self._decode(ids[: self._read]) if self._read else ""
        return self._decode(ids)[len(context):]

    def _advance(self) -> None:
        ids = self._ids
        del ids[: max(0, len(ids) - INCREMENTAL_CONTEXT)]
        self._read = len(ids)

    def step(self, ids: list[int]) -> str:
        self._ids.extend(ids)
        text = self._delta()
        if text.endswith(_REPLACEMENT):
            return ""  # an incomplete UTF-8 character: wait for the token that completes it
        self._advance()
        return text

    def flush(self) -> str:
        if self._read == len(self._ids):
            return ""
        text = self._delta()
        self._advance()
        return text


def _gpt2_char_bytes() -> dict[str, int]:
    """The ByteLevel alphabet: the printable character that stands for each byte (GPT-2's
    `bytes_to_unicode`, which the `tokenizers` ByteLevel decoder inverts)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1),
                 *range(ord("\xae"), ord("\xff") + 1)]
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


def byte_level_table(tok: Any) -> list[bytes] | None:
    """The bytes each id decodes to, when `tok` (a `tokenizers.Tokenizer`) decodes with a plain
    ByteLevel decoder; None otherwise. A token whose characters are all in the ByteLevel
    alphabet is those bytes; any other (an added token such as "<s>" written outside it) is its
    own UTF-8, as the Rust decoder does. Added tokens are checked against `tok.decode`."""
    from tokenizers import decoders

    if not isinstance(tok.decoder, decoders.ByteLevel):
        return None
    char_bytes = _gpt2_char_bytes()
    vocab: dict[str, int] = tok.get_vocab(with_added_tokens=True)
    table = [b""] * (max(vocab.values(), default=-1) + 1)
    for token, tid in vocab.items():
        try:
            table[tid] = bytes([char_bytes[c] for c in token])
        except KeyError:
            table[tid] = token.encode()
    for tid in tok.get_added_tokens_decoder():
        text = tok.decode([tid], skip_special_tokens=False)
        if table[tid].decode("utf-8", "replace") != text:
            table[tid] = text.encode()
    return table


class ByteLevelDecoder:
    """The stream decoder of a byte-level BPE (module docstring): the same events and text as
    `IncrementalDecoder`, one UTF-8 decode per chunk."""

    __slots__ = ("_clean", "_decode", "_held", "_pending", "_table")

    def __init__(self, table: list[bytes]) -> None:
        self._table = table
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._decode = decoder.decode
        self._pending = decoder.getstate  # (bytes inside an unfinished character, flag)
        self._held = ""
        #: nothing held back and no bytes of an unfinished character pending: an ASCII chunk
        #: (most chunks: one token per chunk, and most tokens ASCII) is its own text, so the
        #: step skips the incremental decoder (0.3-0.5 against 2.0-2.1 us per one-id step,
        #: `python -m tests.bench.decode_cost`)
        self._clean = True

    def step(self, ids: list[int]) -> str:
        table = self._table
        try:
            data = table[ids[0]] if len(ids) == 1 else b"".join([table[i] for i in ids])
        except IndexError:  # an id outside the vocabulary: no text
            n = len(table)
            data = b"".join([table[i] for i in ids if i < n])
        if self._clean and data.isascii():
            return data.decode("ascii")
        text = self._held + self._decode(data)
        if self._pending()[0] or text.endswith(_REPLACEMENT):
            self._held = text  # wait for the token that completes (or follows) the character
            self._clean = False
            return ""
        self._held = ""
        self._clean = True
        return text

    def flush(self) -> str:
        text = self._held + self._decode(b"", True)
        self._held = ""
        self._clean = True
        return text


def word_token_id(word: str) -> int:
    """The default tokenizer's id of one whitespace-free word."""
    if word.startswith(_TOKEN_PREFIX) and word.endswith(">"):
        digits = word[len(_TOKEN_PREFIX) : -1]
        if digits.isdigit():
            return int(digits)
    digest = blake3.blake3(word.encode()).digest()
    return WORD_ID_BASE + int.from_bytes(digest[:4], "little") % WORD_ID_SPAN


class WordTokenizer:
    """One token per whitespace-separated word (see the module docstring)."""

    name = "word"
    releases_gil = False  # pure Python: a thread would only contend for the GIL

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._pieces: dict[int, str] = {}

    def encode(self, text: str, limit: int | None = None) -> list[int]:
        ids = self._ids
        out = []
        # maxsplit=limit: at most limit + 1 words, the last one holding the rest of the text;
        # limit + 1 pieces means more than `limit` words, which is all the caller needs.
        words = text.split() if limit is None else text.split(maxsplit=limit)
        if limit is not None and len(words) > limit:
            words[limit] = ""  # the remainder is not one word; the count is what matters
        for word in words:
            tid = ids.get(word)
            if tid is None:
                tid = word_token_id(word)
                if len(ids) < 200_000:
                    ids[word] = tid
            out.append(tid)
        return out

    def decode(self, ids: list[int]) -> str:
        pieces = self._pieces
        try:
            return "".join([pieces[i] for i in ids])
        except KeyError:
            for i in ids:
                if i not in pieces:
                    pieces[i] = f"{_TOKEN_PREFIX}{i}> "
            return "".join([pieces[i] for i in ids])

    def stream_decoder(self) -> StreamDecoder:
        return _Stateless(self)

    def stop_token_id(self, stop: str) -> int | None:
        words = stop.split()
        if len(words) != 1 or words[0] != stop:
            return None
        return word_token_id(stop)


class HFTokenizer:
    """A HuggingFace `tokenizer.json` (file, or a directory holding one)."""

    releases_gil = True  # encode() runs in Rust with the GIL released (below)

    def __init__(self, path: str | Path, special_tokens: bool = False) -> None:
        from lab.shared.hf_tokenizer import TokenizerFileError, load_hf, tokenizer_json

        try:
            self._tok = load_hf(path)
            p = tokenizer_json(path)
        except TokenizerFileError as exc:
            raise ValueError(f"--tokenizer {exc}") from None
        self.name = str(p)
        #: encode a prompt with the post-processor's special tokens (a BOS), as vLLM does
        self.special_tokens = special_tokens
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self._bytes = byte_level_table(self._tok)

    def encode(self, text: str, limit: int | None = None) -> list[int]:
        # A token is at least one character here only for most texts, so the text is encoded
        # whole (its size is bounded by the frontend's body limit); the caller checks `limit`.
        # `encode_batch_fast` of one text: the same ids as `encode`, without the offsets
        # (cheaper), and it releases the GIL (`encode` holds it), so the frontend can run it
        # off its event loop (`releases_gil`).
        return self._tok.encode_batch_fast([text],
                                           add_special_tokens=self.special_tokens)[0].ids

    def decode(self, ids: list[int]) -> str:
        table = self._bytes
        if table is None:
            return self._tok.decode(ids, skip_special_tokens=False)
        n = len(table)
        return b"".join([table[i] for i in ids if i < n]).decode("utf-8", "replace")

    def stream_decoder(self) -> StreamDecoder:
        if self._bytes is not None:
            return ByteLevelDecoder(self._bytes)
        return IncrementalDecoder(self.decode)

    def stop_token_id(self, stop: str) -> int | None:
        ids = self._tok.encode(stop, add_special_tokens=False).ids
        return ids[0] if len(ids) == 1 else None


def load_tokenizer(path: str | Path | None, special_tokens: bool = False) -> Tokenizer:
    """The default word tokenizer, or the HuggingFace tokenizer at `path` (encoding with its
    special tokens when `special_tokens`; the word tokenizer has none)."""
    if path is None or str(path) == "":
        return WordTokenizer()
    return HFTokenizer(path, special_tokens)
