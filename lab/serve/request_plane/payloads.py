"""The request-plane payloads as types (docs/request-plane.md, "Payloads").

Frames carry orjson-encoded JSON objects; these TypedDicts name their keys and value types so
the frontend, the sidecar and the test fakes build and read the same shapes, and the type
checker sees a misspelt key. At run time they are plain dicts (no validation, no cost).

`end_payload` is the one builder of an END: every END carries all six keys.
"""

from __future__ import annotations

from typing import Any, Literal, NotRequired, TypedDict

#: What the frontend does with an END error (docs/request-plane.md, "Error kinds").
ErrorKind = Literal[
    "unavailable", "retryable", "invalid_request", "cancelled", "engine_error", "protocol"
]
Finish = Literal["stop", "length", "cancelled"]


class RequestPayload(TypedDict):
    """REQUEST: one generation request, already tokenized by the frontend."""

    request_id: str
    model: str
    token_ids: list[int]
    max_tokens: int | None
    min_tokens: int | None
    ignore_eos: bool
    stop_token_ids: list[int]
    temperature: float | None
    top_p: float | None
    top_k: int | None
    seed: int | None
    logprobs: bool
    top_logprobs: int | None
    #: decode leg only: the prefill leg's session JSON (lab.serve.handoff)
    handoff: dict[str, Any] | None
    #: decode leg only: the prefill leg's cached prompt tokens
    prefill_cached_tokens: int | None


class ChunkPayload(TypedDict):
    """CHUNK: the tokens of one engine message (never merged across messages)."""

    t: list[int]
    #: with logprobs: one per token
    lp: NotRequired[list[float | None]]
    #: with top_logprobs: per token, [token id, logprob] candidates
    top: NotRequired[list[list[list[float]]]]


class Usage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


class ErrorInfo(TypedDict):
    kind: str  # an ErrorKind
    message: str
    status: int  # the HTTP status the frontend answers with before any token


class EndPayload(TypedDict):
    """END: exactly one per stream, last."""

    finish: str | None  # a Finish; None with an error
    stop_reason: int | str | None
    usage: Usage | None
    handoff: dict[str, Any] | None
    error: ErrorInfo | None
    worker_id: str | None


def end_payload(
    *,
    finish: str | None = None,
    stop_reason: int | str | None = None,
    usage: Usage | None = None,
    handoff: dict[str, Any] | None = None,
    error: ErrorInfo | None = None,
    worker_id: str | None = None,
) -> EndPayload:
    """An END payload with all six keys (the ones not given are None)."""
    return {
        "finish": finish,
        "stop_reason": stop_reason,
        "usage": usage,
        "handoff": handoff,
        "error": error,
        "worker_id": worker_id,
    }
