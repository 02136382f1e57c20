"""Building token events cheaply: token text, logprobs and candidate lists.

Synthetic logprobs follow the reference (docs/mocker.md "Tokens"): the selected token's
logprob is `-0.1 * ((id mod 10) + 1)`; candidate i (rank i + 1) has logprob `selected - 0.1 * i`;
TopN(n) candidates are ids `selected + 0 .. n - 1` (capped at 20), TokenIds the first 20 given
ids, All the top 20.
"""

from __future__ import annotations

from dataclasses import dataclass

from mocker.engine import synthetic_logprob, token_text

from .config import MAX_TOP_N
from .pb import generation_pb2

TokenInfo = generation_pb2.TokenInfo
LogProb = generation_pb2.LogProb

_TEXT: dict[int, str] = {}


def text_of(token_id: int) -> str:
    """`<token:ID>`, memoised (ids repeat a lot; avoids a format per streamed token)."""
    s = _TEXT.get(token_id)
    if s is None:
        s = token_text(token_id)
        if len(_TEXT) < 65536:
            _TEXT[token_id] = s
    return s


@dataclass(frozen=True, slots=True)
class Candidates:
    """A parsed CandidateTokenSelection: `top_n` relative candidates or explicit `ids`."""

    top_n: int = 0
    ids: tuple[int, ...] = ()

    @classmethod
    def parse(cls, sel: generation_pb2.CandidateTokenSelection, present: bool) -> Candidates | None:
        if not present:
            return None
        kind = sel.WhichOneof("selection")
        if kind == "top_n":
            return cls(top_n=min(sel.top_n, MAX_TOP_N))
        if kind == "token_ids":
            return cls(ids=tuple(sel.token_ids.ids[:MAX_TOP_N]))
        if kind == "all":
            return cls(top_n=MAX_TOP_N)
        return None

    def build(self, selected: int, logprob: float) -> list[generation_pb2.LogProb]:
        ids = self.ids or tuple((selected + i) & 0xFFFFFFFF for i in range(self.top_n))
        return [
            LogProb(token_id=t, logprob=logprob - 0.1 * i, token=text_of(t), rank=i + 1)
            for i, t in enumerate(ids)
        ]


def scored_info(
    token_id: int, logprob: float | None, candidates: Candidates | None
) -> generation_pb2.TokenInfo:
    """A token with its logprob, rank 1 and candidates (a None logprob means "not computed")."""
    if logprob is None:
        return TokenInfo(token_id=token_id, token=text_of(token_id))
    if candidates is None:
        return TokenInfo(token_id=token_id, token=text_of(token_id), logprob=logprob, rank=1)
    return TokenInfo(
        token_id=token_id,
        token=text_of(token_id),
        logprob=logprob,
        rank=1,
        candidates=candidates.build(token_id, logprob),
    )


def prompt_output(prompt: list[int], candidates: Candidates | None) -> generation_pb2.PromptOutput:
    """Every prompt token with its synthetic logprob (and candidates when asked for)."""
    return generation_pb2.PromptOutput(
        tokens=[scored_info(t, synthetic_logprob(t), candidates) for t in prompt]
    )


__all__ = [
    "Candidates",
    "prompt_output",
    "scored_info",
    "synthetic_logprob",
    "text_of",
]
