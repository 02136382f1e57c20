"""Parsing and validation of OpenAI request bodies into one internal request.

Every invalid field raises a 400 ApiError that names the field. Fields this frontend does not
use (user, frequency_penalty, ...) are accepted and ignored, as OpenAI clients send them.

Chat template (documented, deliberately simple): each message becomes the line
`"<role>: <content>\\n"` (content parts of type "text" are joined with a space), and the prompt
ends with `"assistant:"`. With the default word tokenizer a single user message of N words is
N + 2 tokens (`user:` ... `assistant:`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lab.serve.frontend.errors import ApiError, bad_field
from lab.serve.tokenizer import Tokenizer

EXTRA_FIELDS = ("worker_id", "timing")
MAX_TOP_LOGPROBS = 20
#: Token ids are u32 on the wire (openengine.v1); larger ones are a 400 naming the field.
MAX_TOKEN_ID = 2**32 - 1
MAX_SEED = 2**64 - 1  # u64 on the wire
# The chat roles of the OpenAI API. Every message but an assistant's must carry `content` (an
# assistant turn may carry tool calls instead), as OpenAI, vLLM and Dynamo require.
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


@dataclass(slots=True)
class GenRequest:
    """One generation request, independent of the endpoint it came from."""

    endpoint: str  # "completions" | "chat"
    model: str
    token_ids: list[int]
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    min_tokens: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    want_worker_id: bool = False
    want_timing: bool = False

    def plane_payload(self, request_id: str) -> dict[str, Any]:
        """The request-plane REQUEST payload (docs/request-plane.md, "RequestPayload"); the
        dispatcher fills model/handoff."""
        return {
            "request_id": request_id,
            "model": self.model,
            "token_ids": self.token_ids,
            "max_tokens": self.max_tokens,
            "min_tokens": self.min_tokens,
            "ignore_eos": self.ignore_eos,
            "stop_token_ids": list(self.stop_token_ids),
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
            "logprobs": self.logprobs,
            "top_logprobs": self.top_logprobs,
            "handoff": None,
            "prefill_cached_tokens": None,
        }

    def continuation_payload(self, request_id: str, generated: list[int]) -> dict[str, Any] | None:
        """The REQUEST of a migration: the prompt plus the tokens already sent, the budget
        left; None when the budget was used up."""
        payload = self.plane_payload(request_id)
        payload["token_ids"] = self.token_ids + generated
        if self.max_tokens is not None:
            remaining = self.max_tokens - len(generated)
            if remaining <= 0:
                return None
            payload["max_tokens"] = remaining
        if self.min_tokens is not None:
            payload["min_tokens"] = max(0, self.min_tokens - len(generated))
        return payload


# --- field helpers -----------------------------------------------------------------------------


def _int(body: dict, name: str, lo: int | None = None, hi: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_field(name, f"expected an integer, got {_kind(value)}")
    if lo is not None and value < lo:
        raise bad_field(name, f"must be >= {lo}, got {_short(value)}")
    if hi is not None and value > hi:
        raise bad_field(name, f"must be <= {hi}, got {_short(value)}")
    return value


def _num(body: dict, name: str, lo: float, hi: float, lo_open: bool = False) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_field(name, f"expected a number, got {_kind(value)}")
    if value < lo or (lo_open and value == lo) or value > hi:
        low = "(" if lo_open else "["
        raise bad_field(name, f"must be in {low}{lo}, {hi}], got {value}")
    return float(value)


def _bool(body: dict, name: str, default: bool = False) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_field(name, f"expected a boolean, got {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _token_list(value: list, name: str) -> list[int]:
    # C-level passes (a prompt is hundreds of ids): the set of element types, then the minimum.
    if value and set(map(type, value)) != {int}:
        raise bad_field(name, "token ids must be integers")
    if value and min(value) < 0:
        raise bad_field(name, f"token ids must be >= 0, got {min(value)}")
    if value and max(value) > MAX_TOKEN_ID:
        raise bad_field(name, f"token ids must be <= {MAX_TOKEN_ID}, got {_short(max(value))}")
    return value


def _short(n: int) -> str:
    """A huge integer named without printing thousands of digits."""
    return str(n) if n.bit_length() < 200 else f"an integer of {n.bit_length()} bits"


def _check_ids(ids: list[int], name: str) -> list[int]:
    """Token ids the tokenizer made from text (`<token:N>` can name any N)."""
    if ids and max(ids) > MAX_TOKEN_ID:
        raise bad_field(
            name, f"holds a token id above {MAX_TOKEN_ID} ({_short(max(ids))}), e.g. <token:N>"
        )
    return ids


def _check_length(ids: list[int], name: str, limit: int | None, text_len: int | None) -> None:
    """Reject a prompt that does not fit the context before it is sent anywhere."""
    if limit is None or len(ids) <= limit:
        return
    if text_len is not None and len(ids) == limit + 1:  # encoding stopped at the limit
        size = f"more than {limit} tokens ({text_len} characters)"
    else:
        size = f"{len(ids)} tokens"
    raise ApiError(
        400,
        f"{name}: the prompt has {size}; the context length is {limit + 1} tokens, so a "
        f"prompt may have at most {limit}",
        param=name,
        code="context_length_exceeded",
    )


# --- endpoint parsers --------------------------------------------------------------------------


def _common(body: Any, endpoint: str, tokenizer: Tokenizer) -> GenRequest:
    if not isinstance(body, dict):
        raise ApiError(
            400, f"request body must be a JSON object, got {_kind(body)}", code="invalid_json"
        )
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_field("model", "required, a non-empty string")
    n = _int(body, "n")
    if n is not None and n != 1:
        raise bad_field("n", "only n=1 is supported")
    best_of = _int(body, "best_of")
    if best_of is not None and best_of != 1:
        raise bad_field("best_of", "only best_of=1 is supported")

    req = GenRequest(endpoint=endpoint, model=model, token_ids=[])
    req.stream = _bool(body, "stream")
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise bad_field("stream_options", f"expected an object, got {_kind(options)}")
        req.include_usage = _bool(options, "include_usage")
        if "include_usage" in options and not isinstance(options["include_usage"], bool | None):
            raise bad_field("stream_options.include_usage", "expected a boolean")

    max_tokens = _int(body, "max_tokens", lo=1, hi=MAX_TOKEN_ID)
    max_completion = _int(body, "max_completion_tokens", lo=1, hi=MAX_TOKEN_ID)
    req.max_tokens = max_completion if max_completion is not None else max_tokens
    req.min_tokens = _int(body, "min_tokens", lo=0, hi=MAX_TOKEN_ID)
    if (
        req.min_tokens is not None
        and req.max_tokens is not None
        and req.min_tokens > req.max_tokens
    ):
        raise bad_field(
            "min_tokens", f"must be <= max_tokens ({req.max_tokens}), got {req.min_tokens}"
        )
    req.temperature = _num(body, "temperature", 0.0, 2.0)
    req.top_p = _num(body, "top_p", 0.0, 1.0, lo_open=True)
    top_k = _int(body, "top_k", lo=-1, hi=MAX_TOKEN_ID)
    req.top_k = top_k if top_k is not None and top_k > 0 else None
    req.seed = _int(body, "seed", lo=0, hi=MAX_SEED)

    nvext = body.get("nvext")
    nv_ignore_eos = False
    if nvext is not None:
        if not isinstance(nvext, dict):
            raise bad_field("nvext", f"expected an object, got {_kind(nvext)}")
        extra = nvext.get("extra_fields")
        if extra is not None:
            if not isinstance(extra, list) or not all(isinstance(x, str) for x in extra):
                raise bad_field("nvext.extra_fields", "expected an array of strings")
            req.want_worker_id = "worker_id" in extra
            req.want_timing = "timing" in extra
        nv_ignore_eos = _bool(nvext, "ignore_eos")
    req.ignore_eos = _bool(body, "ignore_eos") or nv_ignore_eos

    stops: list[int] = []
    stop = body.get("stop")
    if stop is not None:
        items = [stop] if isinstance(stop, str) else stop
        if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
            raise bad_field("stop", "expected a string or an array of strings")
        for s in items:
            tid = tokenizer.stop_token_id(s)
            if tid is not None and tid > MAX_TOKEN_ID:
                raise bad_field("stop", f"token id above {MAX_TOKEN_ID} ({_short(tid)})")
            if tid is None:
                raise bad_field(
                    "stop",
                    f"{s!r} is not a single token of the {tokenizer.name} tokenizer; only stop "
                    "strings that map to one token are supported",
                )
            stops.append(tid)
    stop_ids = body.get("stop_token_ids")
    if stop_ids is not None:
        if not isinstance(stop_ids, list):
            raise bad_field("stop_token_ids", "expected an array of integers")
        stops.extend(_token_list(stop_ids, "stop_token_ids"))
    req.stop_token_ids = tuple(sorted(set(stops)))
    return req


def completion_prompt(body: dict[str, Any]) -> Any:
    """The `prompt` of a /v1/completions body, a batch of one read as its single prompt (a
    string or a list of token ids); unchecked otherwise."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        return prompt[0]
    return prompt


def parse_completion(
    body: Any,
    tokenizer: Tokenizer,
    default_max_tokens: int | None,
    context_length: int | None = None,
) -> GenRequest:
    """A /v1/completions body. `context_length` (from discovery): a longer prompt is a 400."""
    limit = None if context_length is None else max(0, context_length - 1)
    req = _common(body, "completions", tokenizer)
    prompt = completion_prompt(body)
    text_len = None
    if isinstance(prompt, str):
        ids = _check_ids(tokenizer.encode(prompt, limit), "prompt")
        text_len = len(prompt)
    elif isinstance(prompt, list):
        ids = _token_list(prompt, "prompt")
    elif prompt is None:
        raise bad_field("prompt", "required")
    else:
        raise bad_field(
            "prompt", f"expected a string or an array of token ids, got {_kind(prompt)}"
        )
    if not ids:
        raise bad_field("prompt", "must not be empty")
    _check_length(ids, "prompt", limit, text_len)
    req.token_ids = ids
    if _bool(body, "echo"):
        raise bad_field("echo", "echo is not supported")
    logprobs = body.get("logprobs")
    if logprobs is True:
        top: int | None = 0
    elif logprobs is None or logprobs is False:
        top = None
    else:
        top = _int(body, "logprobs", lo=0, hi=MAX_TOP_LOGPROBS)
    if top is not None:
        req.logprobs = True
        req.top_logprobs = top
    if req.max_tokens is None:
        req.max_tokens = default_max_tokens
        if req.min_tokens is not None and req.max_tokens is not None:
            req.max_tokens = max(req.max_tokens, req.min_tokens)
    return req


def parse_chat(body: Any, tokenizer: Tokenizer, context_length: int | None = None) -> GenRequest:
    """A /v1/chat/completions body (messages joined by the template in the module docstring).
    `context_length` (from discovery): a longer prompt is a 400."""
    limit = None if context_length is None else max(0, context_length - 1)
    req = _common(body, "chat", tokenizer)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_field("messages", "required, a non-empty array")
    lines = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise bad_field(f"messages[{i}]", "expected an object")
        role = msg.get("role")
        if not isinstance(role, str) or not role:
            raise bad_field(f"messages[{i}].role", "required, a string")
        if role not in CHAT_ROLES:
            raise bad_field(
                f"messages[{i}].role", f"{role[:40]!r} is not one of {', '.join(CHAT_ROLES)}"
            )
        if role != "assistant" and msg.get("content") is None:
            raise bad_field(f"messages[{i}].content", f"required for role {role!r}")
        lines.append(f"{role}: {_content_text(msg.get('content'), i)}\n")
    lines.append("assistant:")
    text = "".join(lines)
    req.token_ids = _check_ids(tokenizer.encode(text, limit), "messages")
    _check_length(req.token_ids, "messages", limit, len(text))
    req.logprobs = _bool(body, "logprobs")
    top = _int(body, "top_logprobs", lo=0, hi=MAX_TOP_LOGPROBS)
    if top is not None:
        if not req.logprobs:
            raise bad_field("top_logprobs", "requires logprobs: true")
        req.top_logprobs = top
    elif req.logprobs:
        req.top_logprobs = 0
    return req


def _content_text(content: Any, i: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if (
                isinstance(part, dict)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
            ):
                parts.append(part["text"])
            else:
                raise bad_field(f"messages[{i}].content", "only text content parts are supported")
        return " ".join(parts)
    raise bad_field(
        f"messages[{i}].content", f"expected a string or an array, got {_kind(content)}"
    )
