"""Response bodies and SSE events, OpenAI-shaped.

The streaming hot path writes one SSE event per request-plane CHUNK. Each event is a per-request
byte prefix, the orjson-encoded text of the chunk's tokens, and a constant suffix: no dict is
built per event unless logprobs were asked for.

The chunk that carries `finish_reason` has empty text (the END frame carries no tokens) and,
when asked, `nvext`; with `stream_options.include_usage` a last chunk with empty `choices` and
`usage` follows; then `data: [DONE]`.
"""

from __future__ import annotations

from typing import Any

import orjson

from lab.serve.frontend.protocol import GenRequest
from lab.serve.frontend.trace import Trace
from lab.serve.tokenizer import Tokenizer

DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
}


def usage_obj(req: GenRequest, trace: Trace) -> dict[str, Any]:
    """Usage: completion tokens are the tokens actually sent; cached tokens from the END."""
    usage = trace.usage or {}
    prompt = usage.get("prompt_tokens") if not trace.migrations else None
    if not isinstance(prompt, int):
        prompt = len(req.token_ids)
    cached = usage.get("cached_tokens") or 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": trace.tokens,
        "total_tokens": prompt + trace.tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def nvext_obj(req: GenRequest, trace: Trace) -> dict[str, Any] | None:
    if not (req.want_worker_id or req.want_timing):
        return None
    nv: dict[str, Any] = {}
    if req.want_worker_id:
        nv["worker_id"] = trace.worker_ids()
    if req.want_timing:
        nv["timing"] = trace.timing()
    return nv


class Logprobs:
    """Builds the logprobs objects of one request (completions legacy or chat format)."""

    def __init__(self, chat: bool, tokenizer: Tokenizer) -> None:
        self.chat = chat
        self.tok = tokenizer
        self.offset = 0

    def _text(self, tid: int) -> str:
        return self.tok.decode([tid])

    def build(self, payload: dict[str, Any]) -> dict[str, Any]:
        ids = payload.get("t") or []
        lps = payload.get("lp") or [None] * len(ids)
        tops = payload.get("top")
        if self.chat:
            content = []
            for i, tid in enumerate(ids):
                text = self._text(tid)
                entry: dict[str, Any] = {
                    "token": text,
                    "logprob": lps[i],
                    "bytes": list(text.encode()),
                    "top_logprobs": [],
                }
                if tops and i < len(tops):
                    entry["top_logprobs"] = [
                        {"token": (t := self._text(a)), "logprob": b, "bytes": list(t.encode())}
                        for a, b in tops[i]
                    ]
                content.append(entry)
            return {"content": content}
        tokens = [self._text(tid) for tid in ids]
        offsets = []
        for text in tokens:
            offsets.append(self.offset)
            self.offset += len(text)
        top_lp = None
        if tops:
            top_lp = [{self._text(a): b for a, b in top} for top in tops]
        return {
            "tokens": tokens,
            "token_logprobs": list(lps),
            "top_logprobs": top_lp,
            "text_offset": offsets,
        }

    @staticmethod
    def merge(parts: list[dict[str, Any]], chat: bool) -> dict[str, Any] | None:
        if not parts:
            return None
        if chat:
            return {"content": [c for p in parts for c in p["content"]]}
        merged: dict[str, Any] = {
            "tokens": [],
            "token_logprobs": [],
            "top_logprobs": None,
            "text_offset": [],
        }
        tops: list[Any] = []
        for p in parts:
            merged["tokens"].extend(p["tokens"])
            merged["token_logprobs"].extend(p["token_logprobs"])
            merged["text_offset"].extend(p["text_offset"])
            if p["top_logprobs"] is not None:
                tops.extend(p["top_logprobs"])
        merged["top_logprobs"] = tops or None
        return merged


class StreamEncoder:
    """SSE events of one streaming request."""

    __slots__ = ("_base", "_chat", "_first", "_prefix", "_prefix_first", "_suffix")

    def __init__(self, req: GenRequest, response_id: str, created: int, model: str) -> None:
        self._chat = req.endpoint == "chat"
        obj = "chat.completion.chunk" if self._chat else "text_completion"
        base = (
            b'{"id":'
            + orjson.dumps(response_id)
            + b',"object":"'
            + obj.encode()
            + b'","created":'
            + str(created).encode()
            + b',"model":'
            + orjson.dumps(model)
        )
        self._base = base
        if self._chat:
            self._prefix = b"data: " + base + b',"choices":[{"index":0,"delta":{"content":'
            self._prefix_first = (
                b"data: " + base + b',"choices":[{"index":0,"delta":{"role":"assistant","content":'
            )
            self._suffix = b'},"logprobs":null,"finish_reason":null}]}\n\n'
        else:
            self._prefix = self._prefix_first = b"data: " + base + b',"choices":[{"index":0,"text":'
            self._suffix = b',"logprobs":null,"finish_reason":null}]}\n\n'
        self._first = True

    def chunk(self, text: str) -> bytes:
        if self._first:
            self._first = False
            return self._prefix_first + orjson.dumps(text) + self._suffix
        return self._prefix + orjson.dumps(text) + self._suffix

    def reasoning_chunk(self, reasoning: str, answer: str) -> bytes:
        """A chat event of a reasoning span (docs/mocker.md "Reasoning spans"): its text as
        `delta.reasoning_content`, with `delta.content` too when the answer starts in the same
        chunk (as vLLM's reasoning parsers send it)."""
        delta: dict[str, Any] = {"role": "assistant"} if self._first else {}
        self._first = False
        if reasoning:
            delta["reasoning_content"] = reasoning
        if answer or not reasoning:
            delta["content"] = answer
        return (b"data: " + self._base + b',"choices":[{"index":0,"delta":'
                + orjson.dumps(delta)[:-1] + self._suffix)  # the suffix closes the delta

    def chunk_with_logprobs(self, text: str, logprobs: dict[str, Any]) -> bytes:
        choice: dict[str, Any] = {"index": 0}
        if self._chat:
            delta: dict[str, Any] = {"content": text}
            if self._first:
                delta = {"role": "assistant", "content": text}
            choice["delta"] = delta
        else:
            choice["text"] = text
        self._first = False
        choice["logprobs"] = logprobs
        choice["finish_reason"] = None
        return b"data: " + self._base + b',"choices":' + orjson.dumps([choice]) + b"}\n\n"

    def finish(
        self,
        finish_reason: str | None,
        stop_reason: Any,
        nvext: dict[str, Any] | None,
        usage: dict[str, Any] | None,
    ) -> bytes:
        choice: dict[str, Any] = {"index": 0}
        if self._chat:
            choice["delta"] = {"role": "assistant", "content": ""} if self._first else {}
        else:
            choice["text"] = ""
        choice["logprobs"] = None
        choice["finish_reason"] = finish_reason
        if stop_reason is not None:
            choice["stop_reason"] = stop_reason
        tail = b',"choices":' + orjson.dumps([choice])
        if nvext is not None:
            tail += b',"nvext":' + orjson.dumps(nvext)
        out = b"data: " + self._base + tail + b"}\n\n"
        if usage is not None:
            out += (
                b"data: " + self._base + b',"choices":[],"usage":' + orjson.dumps(usage) + b"}\n\n"
            )
        return out + DONE


def full_response(
    req: GenRequest,
    response_id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: str | None,
    stop_reason: Any,
    logprobs: dict[str, Any] | None,
    usage: dict[str, Any],
    nvext: dict[str, Any] | None,
    reasoning: str | None = None,
) -> bytes:
    """A non-streaming response body; `reasoning`: a chat answer's reasoning span's text
    (`message.reasoning_content`), None without a reasoning parser."""
    choice: dict[str, Any] = {"index": 0}
    if req.endpoint == "chat":
        obj = "chat.completion"
        choice["message"] = {"role": "assistant", "content": text}
        if reasoning is not None:
            choice["message"]["reasoning_content"] = reasoning
    else:
        obj = "text_completion"
        choice["text"] = text
    choice["logprobs"] = logprobs
    choice["finish_reason"] = finish_reason
    if stop_reason is not None:
        choice["stop_reason"] = stop_reason
    body: dict[str, Any] = {
        "id": response_id,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage,
    }
    if nvext is not None:
        body["nvext"] = nvext
    return orjson.dumps(body)
