"""One request's record: the typed row of requests.parquet (lab.analysis.rundir.REQUEST_SCHEMA).

The load client builds one `RequestRecord` per request when its response is parsed
(`lab.load.sse.parse_response` fills the response's stamps and counts, `build_record` who sent it
when), the sweep adds the run's columns (`run_id`, `repeat`, `concurrency`, `rate`). Stamps are
`perf_counter_ns` integers and counts only: every millisecond figure is derived by the analysis
(`lab.analysis.request_times`). A failed request is a record with `error_kind` set, never dropped.

A slotted dataclass: setting its fields costs what a dict's item assignment does and it holds
less memory per record than a dict (a sweep keeps every record of the run), while a misspelt
field is an error instead of a silent new key.

`Sent` is what the client keeps of a request in flight until its response is parsed: a
NamedTuple, as cheap to build on the send path as the plain tuple it replaces.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any, NamedTuple


class Sent(NamedTuple):
    """A request in flight: which one, when it was meant and free to go, what it asked for."""

    request_index: int
    intended_ns: int | None  # open loop: the schedule's send time (None in a closed loop)
    scheduled_ns: int  # when the client released it (the send delay is sent - scheduled)
    isl: int | None  # prompt tokens requested
    osl: int | None  # output tokens requested
    streaming: bool
    conversation: int | None = None  # --turns: the conversation this turn belongs to
    turn: int | None = None  # --turns: the turn's number in its conversation (0 first)


@dataclass(slots=True)
class RequestRecord:
    """One request: who sent it when, what came back when, and what the server said."""

    # who sent it, when (lab.load.client / open_loop)
    index: int = 0
    request_id: str = ""
    warmup: bool = False
    client_proc: int = 0
    scheduled_ns: int | None = None
    sent_ns: int | None = None
    intended_ns: int | None = None  # open loop only (docs/open-loop.md)
    isl_requested: int | None = None
    osl_requested: int | None = None
    conversation: int | None = None
    turn: int | None = None
    # the response (lab.load.sse.parse_response)
    http_status: int | None = None
    response_id: str | None = None
    finish_reason: str | None = None
    prefill_worker_id: str | None = None
    decode_worker_id: str | None = None
    moved_from: str | None = None
    error_kind: str | None = None
    error_message: str | None = None
    input_tokens: int | None = None
    input_tokens_source: str | None = None  # "usage" (the server's) or "request" (asked for)
    output_tokens: int | None = None
    output_tokens_source: str | None = None  # "usage", or "chunks" (a lower bound)
    cached_tokens: int | None = None
    chunks: int = 0
    tokens_per_chunk: float | None = None
    chunk_times_ns: list[int] = field(default_factory=list)
    first_ns: int | None = None  # the first content chunk of any kind (TTFT)
    #: the first chunk carrying reasoning (delta.reasoning_content / delta.reasoning; TTFR)
    first_reasoning_ns: int | None = None
    #: the first chunk carrying answer output (TTFO); first_ns when nothing was reasoning
    first_answer_ns: int | None = None
    #: content chunks carrying reasoning only (the answer's: chunks - reasoning_chunks)
    reasoning_chunks: int = 0
    end_ns: int | None = None
    done_ns: int | None = None
    ok: bool = False
    #: --cancel: the client closed it mid-stream on purpose (not an error; not `ok` either, so
    #: it is in no latency figure), and when
    cancelled: bool = False
    cancelled_ns: int | None = None
    #: the answer's text (chat content), kept only when a later turn sends it back (--turns)
    text: str | None = None
    # the run (lab.load.sweep)
    run_id: str | None = None
    concurrency: int = 0
    repeat: int = 0
    rate: float | None = None  # the open-loop level's offered rate (req/s)

    def row(self) -> dict[str, Any]:
        """The stored fields as a dict: a row of requests.parquet, as the analysis reads one."""
        return dict(zip(STORED_FIELDS, _stored(self), strict=True))


#: The record's field names, in order.
RECORD_FIELDS = tuple(f.name for f in fields(RequestRecord))
#: The fields requests.parquet stores (lab.analysis.rundir.REQUEST_SCHEMA): all but the text.
STORED_FIELDS = tuple(name for name in RECORD_FIELDS if name != "text")
_stored = attrgetter(*STORED_FIELDS)


def rows(records: Iterable[RequestRecord]) -> list[dict[str, Any]]:
    """Records as the rows the analysis takes (`requests_frame`, `RequestsWriter.append`)."""
    return [r.row() for r in records]
