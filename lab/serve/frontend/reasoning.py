"""The frontend's reasoning parser (`--reasoning-parser think`; docs/mocker.md "Reasoning
spans"): a chat stream's tokens before the think-end marker go out as
`delta.reasoning_content`, the marker as nothing, the tokens after it as `delta.content`, as
vLLM's `--reasoning-parser` streams a reasoning model. The completions endpoint has no parser:
its text is every token's, marker included (as vLLM's).

The split sits between the writer's decoder and its encoder (`ReasoningDecoder` hands the
`ReasoningEncoder` the two parts of each chunk), so `SseWriter` is the same for every stream
and a stream without a parser pays nothing for it.
"""

from __future__ import annotations

from lab.serve.frontend.encode import StreamEncoder
from lab.serve.frontend.protocol import GenRequest
from lab.serve.tokenizer import StreamDecoder


class ReasoningEncoder(StreamEncoder):
    """A chat stream's encoder while its decoder splits reasoning from answer: a chunk that
    `ReasoningDecoder.step` split is a reasoning event, any other an answer event."""

    __slots__ = ("parts",)

    def __init__(self, req: GenRequest, response_id: str, created: int, model: str) -> None:
        super().__init__(req, response_id, created, model)
        #: the (reasoning, answer) texts of the chunk just decoded, None once in the answer
        self.parts: tuple[str, str] | None = None

    def chunk(self, text: str) -> bytes:
        parts = self.parts
        if parts is None:
            return StreamEncoder.chunk(self, text)
        self.parts = None
        return self.reasoning_chunk(*parts)


class ReasoningDecoder:
    """A stream decoder that ends the reasoning span at the think-end id `end_id`."""

    __slots__ = ("_answering", "_enc", "_end", "_step", "flush")

    def __init__(self, decoder: StreamDecoder, enc: ReasoningEncoder, end_id: int) -> None:
        self._step = decoder.step
        self.flush = decoder.flush
        self._enc = enc
        self._end = end_id
        self._answering = False

    def step(self, ids: list[int]) -> str:
        if self._answering:
            return self._step(ids)
        if self._end not in ids:
            text = self._step(ids)
            self._enc.parts = (text, "") if text else None
            return text
        i = ids.index(self._end)
        reasoning = (self._step(ids[:i]) if i else "") + self.flush()
        rest = ids[i + 1:]
        answer = self._step(rest) if rest else ""
        self._answering = True
        self._enc.parts = (reasoning, answer) if reasoning else None
        return reasoning + answer


def split_reasoning(ids: list[int], end_id: int) -> tuple[list[int], list[int]]:
    """A whole answer's ids as (reasoning, answer) at the think-end id (a non-streaming chat
    answer); no marker: all reasoning (a span cut off by max_tokens)."""
    if end_id not in ids:
        return ids, []
    i = ids.index(end_id)
    return ids[:i], ids[i + 1:]
