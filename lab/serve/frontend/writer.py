"""The per-request writer: where one request's CHUNK payloads go, one call each, in order.

The dispatcher hands every CHUNK to the request's writer in one of two ways:

* `write_now(chunk)`: in the request plane's read callback, without a task switch. The writer
  may decline (False): the chunk then reaches `write` from the dispatcher's task instead.
* `await write(chunk)`: from the dispatcher's task; it may wait (aiohttp's `prepare`, which
  sends the headers with the first event, or a client that reads slowly).

Both go through the one accounting step, `_account` (the token count, first and last token
stamps, the TTFT histogram and, for events, the inter-token histogram), then the writer's output.
`SseWriter` streams SSE events; `UnaryWriter` collects the ids of a non-streaming answer.
"""

from __future__ import annotations

import asyncio
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, Protocol

from lab.serve.frontend.turn_writer import TurnWriter

if TYPE_CHECKING:
    from aiohttp import web

    from lab.serve.frontend.encode import Logprobs, StreamEncoder
    from lab.serve.frontend.metrics import FrontendMetrics, Histogram
    from lab.serve.frontend.trace import Trace
    from lab.serve.tokenizer import StreamDecoder

#: The synchronous token path writes to the client's transport only while less than this is
#: buffered in it (aiohttp's own drain limit); above it, tokens take the awaiting path, which
#: waits for the client to read.
DIRECT_WRITE_LIMIT = 0x10000


def chunked(data: bytes) -> bytes:
    """One HTTP/1.1 chunk (the response uses chunked transfer encoding)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


class ChunkWriter(Protocol):
    """What the dispatcher writes a request's chunks to (module docstring)."""

    def write_now(self, chunk: dict[str, Any]) -> bool:
        """Take the chunk without waiting (True), or decline it (False)."""
        ...

    async def write(self, chunk: dict[str, Any]) -> None:
        """Take the chunk, waiting if need be."""
        ...


class _NoHistogram:
    """The inter-token histogram of a request that sends no events (a non-streaming answer)."""

    __slots__ = ()

    def observe(self, value: float, n: int = 1) -> None:
        pass


_NO_ITL = _NoHistogram()


class _Accounting:
    """The accounting step both writes share."""

    __slots__ = ("_itl", "_metrics", "_per_event", "trace")

    def __init__(self, trace: Trace, metrics: FrontendMetrics, per_event: bool) -> None:
        self.trace = trace
        self._metrics = metrics
        self._per_event = per_event  # events: the inter-token histogram counts their gaps
        self._itl: Histogram | _NoHistogram = _NO_ITL

    def _account(self, n: int) -> None:
        """`n` tokens arrived now."""
        now = perf_counter_ns()
        trace = self.trace
        if trace.first_token_ns:
            self._itl.observe((now - trace.last_token_ns) / (1e9 * n), n)
        else:
            trace.first_token_ns = now
            worker = trace.decode_worker_id or "none"
            metrics = self._metrics
            metrics.ttft_hist(worker).observe((now - trace.received_ns) / 1e9)
            if self._per_event:
                self._itl = metrics.itl_hist(worker)
        trace.last_token_ns = now
        trace.tokens += n


class SseWriter(_Accounting):
    """One SSE event per chunk with text (a chunk whose text is held back, an incomplete
    character, writes none: the next event has it). The headers leave with the first event,
    through aiohttp (`prepare`); after it, while the client keeps up, events go to the
    transport directly, and those of one loop turn share one write (`TurnWriter`)."""

    __slots__ = ("_batch", "_decode", "_decoder", "_enc", "_lp", "_request", "_resp",
                 "_transport")

    def __init__(
        self,
        request: web.Request,
        resp: web.StreamResponse,
        enc: StreamEncoder,
        decoder: StreamDecoder,
        logprobs: Logprobs | None,
        trace: Trace,
        metrics: FrontendMetrics,
    ) -> None:
        super().__init__(trace, metrics, per_event=True)
        self._request = request
        self._resp = resp
        self._enc = enc
        self._decoder = decoder
        self._decode = decoder.step
        self._lp = logprobs
        self._batch = TurnWriter(asyncio.get_running_loop())
        # set once aiohttp has written the headers and the first event: then chunks may go
        # to the transport directly
        self._transport: asyncio.Transport | None = None

    def _direct_ok(self) -> bool:
        """aiohttp has sent the headers and the first event, and the client keeps up: the
        next events may go to the transport (this turn's write) without awaiting."""
        t = self._transport
        return not (t is None or t.is_closing()
                    or t.get_write_buffer_size() + self._batch.pending > DIRECT_WRITE_LIMIT)

    def write_now(self, chunk: dict[str, Any]) -> bool:
        """Declines until aiohttp has sent the headers and the first event, while the client
        is behind, and for a request with logprobs (their events are built by `write`)."""
        if self._lp is not None or not self._direct_ok():
            return False
        ids = chunk["t"]
        if ids:
            self._account(len(ids))
            text = self._decode(ids)
            if text:
                self._batch.write(chunked(self._enc.chunk(text)))
        return True

    async def write(self, chunk: dict[str, Any]) -> None:
        ids = chunk["t"]
        if not ids:
            return
        first = not self.trace.first_token_ns
        self._account(len(ids))
        resp = self._resp
        if first:
            await resp.prepare(self._request)
        if self._lp is not None:
            await resp.write(self._enc.chunk_with_logprobs(self._decode(ids),
                                                           self._lp.build(chunk)))
            return
        text = self._decode(ids)
        batch = self._batch
        if text:  # held back (an incomplete character): no event, the next one has it
            if self._direct_ok():  # chunks queued behind the first one join this turn's write
                batch.write(chunked(self._enc.chunk(text)))
            else:  # the first event (with the headers), or the client is behind
                batch.flush()
                await resp.write(self._enc.chunk(text))
        self._transport = batch.transport = self._request.transport

    def stop(self) -> None:
        """No more chunks: what this turn holds is written, the end is stamped. Called before
        the stream's last write (its end, or an error event)."""
        self._batch.flush()
        self.trace.end_ns = perf_counter_ns()

    async def finish(self, end: bytes) -> None:
        """The text still held back, then `end` (the finish event, usage, [DONE]) and the
        chunked-encoding terminator, in one write (after `stop`)."""
        resp = self._resp
        if not resp.prepared:
            await resp.prepare(self._request)
        tail = self._decoder.flush()
        await resp.write_eof(self._enc.chunk(tail) + end if tail else end)


class UnaryWriter(_Accounting):
    """Collects a non-streaming answer's ids (and logprobs); never declines, never waits."""

    __slots__ = ("_lp", "ids", "logprobs")

    def __init__(self, logprobs: Logprobs | None, trace: Trace, metrics: FrontendMetrics) -> None:
        super().__init__(trace, metrics, per_event=False)
        self._lp = logprobs
        self.ids: list[int] = []
        self.logprobs: list[dict[str, Any]] = []

    def write_now(self, chunk: dict[str, Any]) -> bool:
        ids = chunk["t"]
        if ids:
            self._account(len(ids))
            self.ids.extend(ids)
            if self._lp is not None:
                self.logprobs.append(self._lp.build(chunk))
        return True

    async def write(self, chunk: dict[str, Any]) -> None:
        self.write_now(chunk)
