"""Turn one response's raw SSE events (stamped on arrival) into a request's record
(`lab.load.record.RequestRecord`, a row of requests.parquet): the
nanosecond stamps and counts of the request, no millisecond figure (the analysis derives those).

The client keeps the response body as it arrived: decoded pieces, each with the
`perf_counter_ns()` stamp of the read that carried it. This module splits them into SSE events
afterwards (an event's time is the arrival of the read that completed it, so several events in
one read share that read's stamp) and parses them (orjson), so the hot path per read is one
clock read and one append.

A chunk counts as a token chunk only if it carries content: non-empty `text` (completions),
non-empty `delta.content` (chat), non-empty `token_ids`, or a reasoning model's thinking:
non-empty `delta.reasoning_content` (vLLM, SGLang, the lab frontend) or `delta.reasoning`
(newer servers). Role-only and usage-only chunks are not tokens. The first chunk of any kind
is the TTFT stamp (`first_ns`, as AIPerf's TTFT); the first chunk with reasoning and the first
with answer text are stamped apart (`first_reasoning_ns`, `first_answer_ns`: TTFO), and the
chunks with reasoning only are counted (`reasoning_chunks`). A reasoning chunk has no
`delta.content`, so it takes the parser's slower path and the answer events' fast path is
unchanged. A chunk may carry several tokens' text (a streaming detokenizer holds back a
token ending inside a UTF-8 character and sends it with the next one), so output tokens come
from the server's usage when it has one, and tokens per chunk is usage tokens / content chunks;
only without usage are output tokens the chunk count (`output_tokens_source` "chunks", a lower
bound).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate

import orjson

from lab.load.record import RequestRecord


@dataclass
class RawResponse:
    """What the client captured for one request, before parsing."""

    sent_ns: int
    status: int | None = None
    times: list[int] = field(default_factory=list)  # arrival ns of the read carrying each piece
    pieces: list[bytes] = field(default_factory=list)  # streamed body bytes, as they arrived
    done_ns: int | None = None  # response fully read
    body: bytes | None = None  # non-200 or non-streaming response body
    error_kind: str | None = None
    error_message: str | None = None
    resends: int = 0  # sent again on a new connection (a reused one closed before the response)
    cancelled_ns: int | None = None  # the client closed it mid-stream (--cancel), when


def split_events(times: list[int], pieces: list[bytes], end_ns: int | None = None
                 ) -> tuple[list[int], list[bytes]]:
    """SSE events (without their blank-line terminator) and the arrival time of each: the
    stamp of the piece that completed it. A final unterminated event gets `end_ns`."""
    body = b"".join(pieces)
    if b"\r" in body:
        return _split_events_crlf(times, pieces, end_ns)
    events = body.split(b"\n\n")
    tail = events.pop()
    ev_times: list[int] = []
    if events:
        ends = list(accumulate(map(len, pieces)))
        j = 0
        pos = 0
        for ev in events:
            pos += len(ev) + 2  # just past this event's terminator
            while ends[j] < pos:
                j += 1
            ev_times.append(times[j])
    if tail.strip():
        ev_times.append(end_ns if end_ns is not None else (times[-1] if times else 0))
        events.append(tail)
    return ev_times, events


def _split_events_crlf(times: list[int], pieces: list[bytes], end_ns: int | None
                       ) -> tuple[list[int], list[bytes]]:
    """`split_events` for CRLF line endings (rare): piece by piece, normalizing to LF (the
    unfinished rest is joined to the next piece first, so a CR | LF split is normalized too)."""
    ev_times: list[int] = []
    events: list[bytes] = []
    buf = b""
    for t, p in zip(times, pieces, strict=True):
        p = (buf + p).replace(b"\r\n", b"\n")
        start = 0
        while True:
            k = p.find(b"\n\n", start)
            if k < 0:
                break
            ev_times.append(t)
            events.append(p[start:k])
            start = k + 2
        buf = p[start:]
    if buf.strip():
        ev_times.append(end_ns if end_ns is not None else (times[-1] if times else 0))
        events.append(buf)
    return ev_times, events


def error_message_from_body(body: bytes | None, limit: int = 500) -> str:
    """The `error.message` of an OpenAI error body, else the body text (truncated)."""
    if not body:
        return ""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:limit].decode(errors="replace")
    if isinstance(obj, dict):
        err = obj.get("error")
        if isinstance(err, dict):
            msg = str(err.get("message") or "")
            kind = err.get("type") or err.get("code")
            return f"{kind}: {msg}" if kind else msg
        if isinstance(err, str):
            return err
        if "detail" in obj:
            return str(obj["detail"])[:limit]
        if isinstance(obj.get("message"), str):  # e.g. Dynamo: {"message", "type", "code"}
            return obj["message"][:limit]
    return body[:limit].decode(errors="replace")


# top-level keys of a chunk that `_absorb` has nothing to take from once the id is known
_PLAIN_KEYS = frozenset({"id", "object", "created", "model", "choices", "system_fingerprint",
                         "service_tier"})
_EMPTY: dict = {}


def _text(choice: dict) -> str:
    """A content chunk's text: completions' `text`, chat's `delta.content` or `message.content`."""
    text = choice.get("text")
    if text:
        return str(text)
    part = choice.get("delta") or choice.get("message") or _EMPTY
    return str(part.get("content") or "")


#: what `_content` finds in a choice: answer output, reasoning, or both (bits)
ANSWER = 1
REASONING = 2


def _content(choice: dict) -> int:
    """ANSWER | REASONING bits of a choice (0 = no output: role-only, usage-only, empty)."""
    text = choice.get("text")
    if text:
        return ANSWER
    part = choice.get("delta") or choice.get("message")
    if part:
        kind = ANSWER if part.get("content") or part.get("token_ids") else 0
        if part.get("reasoning_content") or part.get("reasoning"):
            kind |= REASONING
        if kind:
            return kind
    return ANSWER if choice.get("token_ids") else 0


class _Parse:
    """What parsing one response gathers beside the record's own fields."""

    __slots__ = ("first_reasoning_ns", "reasoning_only", "text", "usage")

    def __init__(self, keep_text: bool) -> None:
        self.usage: dict | None = None
        self.text: list[str] | None = [] if keep_text else None
        self.first_reasoning_ns: int | None = None
        #: indices (into the content chunks) of the chunks with reasoning and no answer
        self.reasoning_only: list[int] = []

    def content(self, kind: int, t: int, chunk_times: list[int]) -> None:
        """Record a content chunk of `kind` (ANSWER | REASONING bits) that arrived at `t`."""
        if kind & REASONING:
            if self.first_reasoning_ns is None:
                self.first_reasoning_ns = t
            if not kind & ANSWER:
                self.reasoning_only.append(len(chunk_times))
        chunk_times.append(t)


def _absorb(obj: dict, out: RequestRecord, state: _Parse) -> int:
    """Fold one parsed chunk into `out`; return what output it carries (`_content`'s bits)."""
    if out.response_id is None and obj.get("id"):
        out.response_id = obj["id"]
    err = obj.get("error")
    if err:
        out.error_kind = "stream_error"
        out.error_message = (error_message_from_body(orjson.dumps({"error": err}))
                             if isinstance(err, dict) else str(err))
    has_content = 0
    for choice in obj.get("choices") or ():
        kind = _content(choice)
        if kind:
            has_content |= kind
            if kind & ANSWER and state.text is not None:
                state.text.append(_text(choice))
        if choice.get("finish_reason"):
            out.finish_reason = choice["finish_reason"]
    usage = obj.get("usage")
    if usage:
        if not isinstance(usage, dict):
            raise TypeError(f"usage is a {type(usage).__name__}, not an object")
        state.usage = usage
    nvext = obj.get("nvext")
    if nvext:
        wid = nvext.get("worker_id")
        if isinstance(wid, dict):
            out.prefill_worker_id = wid.get("prefill_worker_id") or out.prefill_worker_id
            out.decode_worker_id = wid.get("decode_worker_id") or out.decode_worker_id
            moved = wid.get("moved_from")
            if moved:
                out.moved_from = ",".join(str(w) for w in moved)
        elif isinstance(wid, str):
            out.decode_worker_id = wid
    return has_content


#: What a well-formed JSON event of the wrong shape raises while it is read (e.g. "choices": "x").
_SHAPE_ERRORS = (AttributeError, TypeError, ValueError, KeyError, IndexError)


def _malformed(out: RequestRecord, event: bytes | None, exc: BaseException) -> None:
    """Record a wrongly shaped event as this request's error, naming the offending line."""
    text = (event or b"")[:200].decode(errors="replace")
    out.error_kind = "protocol"
    out.error_message = f"malformed response event ({type(exc).__name__}: {exc}): {text}"


def _count(obj: dict, key: str, out: RequestRecord) -> int | None:
    """A token count from usage; a value that is not a non-negative integer is a protocol
    error (recorded) and counts as absent."""
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        if out.error_kind is None:
            out.error_kind = "protocol"
            out.error_message = f"usage.{key} is not a token count: {str(value)[:100]}"
        return None
    return value


def parse_response(raw: RawResponse, streaming: bool, keep_text: bool = False
                   ) -> RequestRecord:
    """The measured fields of one request (the per-request columns the client owns): stamps
    and counts only; every millisecond figure is derived from them by the analysis
    (`lab.analysis.request_times`). `keep_text`: also keep the answer's text (`text`), for a
    conversation's next turn."""
    out = RequestRecord(sent_ns=raw.sent_ns, http_status=raw.status, error_kind=raw.error_kind,
                        error_message=raw.error_message)
    state = _Parse(keep_text)
    chunk_times: list[int] = []
    saw_done = False
    if streaming and raw.status == 200:
        loads = orjson.loads
        plain = not keep_text  # the fast path skips _absorb, which gathers the text
        for t, ev in zip(*split_events(raw.times, raw.pieces, raw.done_ns), strict=True):
            try:
                if ev.startswith(b"data: {") and b"\n" not in ev:  # the usual one-line event
                    try:
                        obj = loads(ev[6:])
                    except orjson.JSONDecodeError:
                        pass
                    else:
                        # most events: one choice with content and nothing else to record
                        choices = obj.get("choices")
                        if (plain and choices and len(choices) == 1
                                and out.response_id is not None
                                and _PLAIN_KEYS.issuperset(obj)):
                            c = choices[0]
                            if c.get("finish_reason") is None and (
                                    c.get("text") or (c.get("delta") or _EMPTY).get("content")):
                                chunk_times.append(t)
                                continue
                        if kind := _absorb(obj, out, state):
                            state.content(kind, t, chunk_times)
                        continue
                is_error_event = False
                for line in ev.split(b"\n"):
                    if line.startswith(b"data:"):
                        payload = line[5:].strip()
                        if payload == b"[DONE]":
                            saw_done = True
                            continue
                        if not payload:
                            continue
                        try:
                            obj = orjson.loads(payload)
                        except orjson.JSONDecodeError:
                            out.error_kind = out.error_kind or "protocol"
                            out.error_message = out.error_message or (
                                f"unparsable SSE data: {payload[:200].decode(errors='replace')}"
                            )
                            continue
                        if not isinstance(obj, dict):
                            continue
                        if is_error_event and "error" not in obj:
                            obj = {"error": obj}
                        if kind := _absorb(obj, out, state):
                            state.content(kind, t, chunk_times)
                    elif line.startswith(b"event:") and b"error" in line:
                        is_error_event = True
            except _SHAPE_ERRORS as exc:
                _malformed(out, ev, exc)
                break
        if (out.error_kind is None and raw.error_kind is None and not saw_done
                and raw.cancelled_ns is None):
            out.error_kind = "incomplete"
            out.error_message = "stream ended without [DONE]"
    elif raw.status == 200 and raw.body is not None:
        try:
            obj = orjson.loads(raw.body)
        except orjson.JSONDecodeError:
            obj = None
            out.error_kind = "protocol"
            out.error_message = "unparsable JSON response"
        try:
            kind = _absorb(obj, out, state) if isinstance(obj, dict) else 0
            if kind and raw.done_ns is not None:
                state.content(kind, raw.done_ns, chunk_times)
        except _SHAPE_ERRORS as exc:
            _malformed(out, raw.body, exc)
    elif raw.status is not None and raw.status != 200 and out.error_kind is None:
        out.error_kind = f"http_{raw.status}"
        out.error_message = error_message_from_body(raw.body)

    usage = state.usage or {}
    n_chunks = len(chunk_times)
    completion = _count(usage, "completion_tokens", out)
    if completion is not None:
        out.output_tokens = completion
        out.output_tokens_source = "usage"
    else:
        out.output_tokens = n_chunks
        out.output_tokens_source = "chunks"
    out.input_tokens = _count(usage, "prompt_tokens", out)
    details = usage.get("prompt_tokens_details") or {}
    cached = _count(details, "cached_tokens", out) if isinstance(details, dict) else None
    if cached is None:
        cached = _count(usage, "cached_tokens", out)
    out.cached_tokens = cached
    out.chunks = n_chunks
    out.tokens_per_chunk = out.output_tokens / n_chunks if n_chunks else None
    out.chunk_times_ns = chunk_times
    out.first_ns = chunk_times[0] if chunk_times else None
    out.end_ns = chunk_times[-1] if chunk_times else None
    out.first_reasoning_ns = state.first_reasoning_ns
    out.reasoning_chunks = len(state.reasoning_only)
    if state.reasoning_only:  # the first chunk that is not reasoning only
        only = set(state.reasoning_only)
        out.first_answer_ns = next(
            (t for i, t in enumerate(chunk_times) if i not in only), None)
    else:
        out.first_answer_ns = out.first_ns
    out.done_ns = raw.done_ns
    out.ok = out.error_kind is None and raw.cancelled_ns is None
    if raw.cancelled_ns is not None:  # left by the client: not an error, unless one came first
        out.cancelled_ns = raw.cancelled_ns
        out.cancelled = out.error_kind is None
    if state.text is not None:
        out.text = "".join(state.text)
    return out
