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
(add_special_tokens=False), and the launched engines emit only ids of its vocabulary
(`mocker serve --tokenizer`). Its stop strings map when they encode to exactly one token.

A stream decodes through `stream_decoder()`, an incremental detokenizer like vLLM's: each chunk's
text is decode(context + new ids) minus decode(context), with a few previous tokens as context
(so a decoder that joins pieces renders a boundary as a one-shot decode would), and text ending
in U+FFFD (a byte-level token ending inside a UTF-8 character) is held back until a later token
completes the character; the end of the stream flushes what is left. A chunk whose text is held
back writes no event (its tokens reach the client with the next one; usage counts them).
An id outside the vocabulary decodes to no text, as the `tokenizers` decoder does (a real engine
never emits one; the launched mockers are given the same tokenizer).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import blake3

WORD_ID_BASE = 1000
WORD_ID_SPAN = 31000
_TOKEN_PREFIX = "<token:"


class Tokenizer(Protocol):
    name: str

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

    def __init__(self, path: str | Path) -> None:
        from lab.shared.hf_tokenizer import TokenizerFileError, load_hf, tokenizer_json

        try:
            self._tok = load_hf(path)
            p = tokenizer_json(path)
        except TokenizerFileError as exc:
            raise ValueError(f"--tokenizer {exc}") from None
        self.name = str(p)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, limit: int | None = None) -> list[int]:
        # A token is at least one character here only for most texts, so the text is encoded
        # whole (its size is bounded by the frontend's body limit); the caller checks `limit`.
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)

    def stream_decoder(self) -> StreamDecoder:
        return IncrementalDecoder(self.decode)

    def stop_token_id(self, stop: str) -> int | None:
        ids = self._tok.encode(stop, add_special_tokens=False).ids
        return ids[0] if len(ids) == 1 else None


def load_tokenizer(path: str | Path | None) -> Tokenizer:
    """The default word tokenizer, or the HuggingFace tokenizer at `path`."""
    if path is None or str(path) == "":
        return WordTokenizer()
    return HFTokenizer(path)
