"""Reasoning spans: how the engine marks where a reasoning model's thinking ends, in one place
(docs/mocker.md "Reasoning spans").

A reasoning model (DeepSeek-R1, Qwen3) emits its thinking, then a think-end token
(`</think>`), then the answer; the server's reasoning parser (vLLM's `--reasoning-parser`,
here the frontend's `--reasoning-parser think`) splits the stream there: tokens before the marker
stream as `delta.reasoning_content`, after it as `delta.content`, the marker itself as nothing.
The mocker does the same with its engine args `reasoning_tokens` / `reasoning_share`
(mocker/engine/config.py): it emits the span first, then the marker, then the answer, all as
ordinary token ids of the vocabulary, so no field of `openengine.v1` changes.

The marker is one id that the engine and the frontend resolve the same way, from the tokenizer
both are given (`think_end_id`): the tokenizer's own `</think>` token, or, with the default word
tokenizer, WORD_THINK_END_ID, an id below the word tokenizer's range that the engine never draws
otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lab.shared.hf_tokenizer import TokenizerFileError, load_hf

#: The text of the think-end token of reasoning models.
THINK_END_TEXT = "</think>"
#: The think-end id under the default word tokenizer: below its ids [1000, 32000), so the
#: engine's default table never draws it; the word tokenizer decodes it as `<token:999> `.
WORD_THINK_END_ID = 999
#: The frontend's reasoning parsers ("" = none: every token is answer text).
REASONING_PARSERS = ("think",)
#: The engine args that configure a span (mocker/engine/config.py, EngineArgs); the launcher
#: turns the frontend's parser on when a fleet's engine args give one of them.
REASONING_ENGINE_ARGS = ("reasoning_tokens", "reasoning_share")


def think_end_id(tokenizer: str | None) -> int:
    """The think-end marker's id under `tokenizer` (a HuggingFace tokenizer path; None or "" =
    the word tokenizer). ValueError naming the path when the tokenizer has no `</think>`."""
    if not tokenizer:
        return WORD_THINK_END_ID
    try:
        tid = load_hf(tokenizer).token_to_id(THINK_END_TEXT)
    except TokenizerFileError as exc:
        raise ValueError(str(exc)) from None
    if tid is None:
        raise ValueError(f"{tokenizer}: the tokenizer has no {THINK_END_TEXT} token, which a "
                         "reasoning span needs as its end marker")
    return int(tid)


def engine_args_reason(engine_args: Mapping[str, Any] | None) -> bool:
    """Whether engine args (a fleet's JSON object) configure a reasoning span."""
    return engine_args is not None and any(engine_args.get(k) for k in REASONING_ENGINE_ARGS)
