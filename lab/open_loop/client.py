"""The open-loop load client: requests sent at their intended times, whatever the server does.

A closed loop sends the next request when a response ends, so a slow server is sent less and
its queueing never shows (coordinated omission). Here every request has an intended send time
from the level's arrival schedule (`lab.open_loop.arrivals`) and is sent then, on an idle kept-alive
connection or a new one; nothing waits for a response before sending.

Each record carries three stamps before the response's own:

- `intended_ns`: when the schedule meant it to be sent;
- `scheduled_ns`: when the client released it: the intended time, or, when `max_concurrency`
  requests were already in flight, the moment one of them ended (the request was held at the
  client, in order; never dropped);
- `sent_ns`: when it was handed to the socket (before connecting, when a connection is opened).

`sent - scheduled` is the client's dispatch lag (the send delay of docs/metrics.md);
`scheduled - intended` is the time held by the concurrency cap. The analysis derives latency
and TTFT both from `sent_ns` and from `intended_ns` (`lab.analysis.request_times`).

Timing: a timer wakes the scheduler `SPIN_NS` before a send is due; the rest is waited by
yielding to the event loop (which keeps reading responses meanwhile), because a loop timer
alone fires up to a millisecond late. Finished responses are parsed in the idle time between
sends, never while a send is due.

`procs > 1` splits the schedule over K processes (`arrivals.split_streams`), each sending its
share at the same intended times, on the same clock (`perf_counter_ns` is system-wide).
"""

from __future__ import annotations

import asyncio
import functools
import multiprocessing as mp
import resource
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from lab.load.client import (
    _HEADERS,
    PROGRESS_INTERVAL_S,
    LevelProgress,
    LevelResult,
    RecordBook,
    RemoteClients,
    _Payloads,
    arm_cancel,
    connect_for,
    endpoint_url,
    run_client_processes,
    split_share,
)
from lab.load.client_settings import IN_PROCESS, ClientSettings
from lab.load.http1 import Http1Connection, Origin, post_request
from lab.load.priority import client_scheduling
from lab.load.record import RequestRecord, Sent
from lab.load.sse import RawResponse
from lab.open_loop.arrivals import split_streams

#: The scheduler's timer aims this long before a send is due, then yields to the loop.
SPIN_NS = 200_000
#: Finished responses are parsed only while the next send is at least this far away.
PARSE_SLACK_NS = 2_000_000
#: Sends in a row without yielding to the event loop, when the schedule is behind.
MAX_SENDS_WITHOUT_YIELD = 16

#: A request built ahead of its send: its context, the response it fills, its bytes, its callback.
_Prepared = tuple[Sent, RawResponse, bytes, Callable[..., None]]


class _OpenDriver(RecordBook):
    """One process's share of an open-loop level: its requests at their intended times."""

    def __init__(self, url: str, payloads: _Payloads, indices: np.ndarray, offsets: np.ndarray,
                 warmup: int, options: ClientSettings, max_concurrency: int | None,
                 proc: int = 0, done: Any = None, errors: Any = None) -> None:
        super().__init__(options, warmup, proc, done, errors)
        self.url = url
        self.payloads = payloads
        self.indices = [int(i) for i in indices]
        self.offsets = [int(o) for o in offsets]
        self.cap = max_concurrency
        self.finished: deque[tuple[Sent, RawResponse]] = deque()
        # kept-alive connections, longest idle first: a send takes the one idle longest, as
        # aiohttp's pool (AIPerf) does; one that has just answered may still wait on the
        # client's delayed ACK behind a server without TCP_NODELAY (docs/open-loop.md)
        self.idle: deque[Http1Connection] = deque()
        self.conns: set[Http1Connection] = set()  # every connection opened (closed at the end)
        self.held: deque[tuple[int, int]] = deque()
        self.inflight = 0
        self.scheduled_all = False
        self.all_done: asyncio.Event | None = None
        self.tg: asyncio.TaskGroup | None = None
        self.origin: Origin | None = None
        self.head = b""
        self.rid_prefix = options.request_id_prefix.encode()
        self.cancel = options.cancels()

    # ----- sending -----

    def _prepare(self, i: int, intended: int, scheduled: int) -> _Prepared:
        """Everything request `i` needs but its send stamp, built before it is due: the
        record's context, the response it fills, the request's bytes and its callback."""
        data, isl, osl, streaming = self.payloads.get(i)
        ctx = Sent(i, intended, scheduled, isl, osl, streaming)
        rid = b"X-Request-Id: %s%d\r\n" % (self.rid_prefix, i)
        return (ctx, RawResponse(sent_ns=0), post_request(self.head, rid, data),
                functools.partial(self._on_response, ctx))

    def _send(self, prepared: _Prepared) -> None:
        """At the due time: stamp, write on an idle kept-alive connection (or connect), and only
        then what can wait."""
        ctx, raw, request, on_response = prepared
        self.inflight += 1  # before the write: a write that fails completes the request at once
        raw.sent_ns = time.perf_counter_ns()
        idle = self.idle
        while idle:
            conn = idle.popleft()
            if not conn.closed and not conn.stale(raw.sent_ns):
                conn.request(request, raw, ctx.streaming, on_response, self.options.timeout)
                if self.cancel is not None:
                    arm_cancel(self.cancel, conn, raw, ctx.request_index)
                return
            conn.close()  # closed, or idle past the server's keep-alive timeout
            self.conns.discard(conn)
        assert self.tg is not None
        self.tg.create_task(self._connect_and_write(ctx, raw, request, on_response))

    async def _connect_and_write(self, ctx: Sent, raw: RawResponse, request: bytes,
                                 on_response: Callable[..., None]) -> None:
        assert self.origin is not None
        conn = await connect_for(self.origin, self.options, raw)
        if conn is not None:
            self.conns.add(conn)
            try:
                remaining = self.options.timeout - (time.perf_counter_ns() - raw.sent_ns) / 1e9
                conn.request(request, raw, ctx.streaming, on_response, max(remaining, 1e-3))
                if self.cancel is not None:
                    arm_cancel(self.cancel, conn, raw, ctx.request_index)
            except Exception as exc:  # never lose a request: anything unexpected is a row
                conn.close()
                raw.error_kind, raw.error_message = "client_error", f"{type(exc).__name__}: {exc}"
                raw.done_ns = time.perf_counter_ns()
            else:
                return
        self._complete(ctx, raw)

    def _on_response(self, ctx: Sent, conn: Http1Connection, raw: RawResponse,
                     reusable: bool) -> None:
        if reusable and not self.options.fresh_connection:
            self.idle.append(conn)
            self.conns.add(conn)  # new when the request was resent (lab.load.http1)
        else:
            conn.close()
            self.conns.discard(conn)
        self._complete(ctx, raw)

    def _complete(self, ctx: Sent, raw: RawResponse) -> None:
        self.finished.append((ctx, raw))
        self.inflight -= 1
        if self.held and (self.cap is None or self.inflight < self.cap):
            i, intended = self.held.popleft()
            self._send(self._prepare(i, intended, time.perf_counter_ns()))
        if (self.scheduled_all and self.inflight == 0 and not self.held
                and self.all_done is not None):
            self.all_done.set()

    # ----- parsing and bookkeeping -----

    def _parse(self, until_ns: int | None = None) -> None:
        perf = time.perf_counter_ns
        while self.finished and (until_ns is None or perf() < until_ns):
            self.book(*self.finished.popleft())

    async def _progress_ticker(self, progress: Callable[[LevelProgress], None], t0: int) -> None:
        while True:
            await asyncio.sleep(PROGRESS_INTERVAL_S)
            progress(LevelProgress(self.done, len(self.indices), self.errors,
                              (time.perf_counter_ns() - t0) / 1e9))

    async def _schedule(self, start_ns: int) -> None:
        perf = time.perf_counter_ns
        since_yield = 0
        for i, offset in zip(self.indices, self.offsets, strict=True):
            target = start_ns + offset
            prepared = self._prepare(i, target, target)  # nothing left to build when it is due
            wait = target - SPIN_NS - perf()
            if wait > PARSE_SLACK_NS and self.finished:
                self._parse(until_ns=target - PARSE_SLACK_NS)
                wait = target - SPIN_NS - perf()
            if wait > 0:
                await asyncio.sleep(wait / 1e9)
                since_yield = 0
            while perf() < target:
                await asyncio.sleep(0)
                since_yield = 0
            if since_yield >= MAX_SENDS_WITHOUT_YIELD:
                await asyncio.sleep(0)
                since_yield = 0
            if self.cap is not None and self.inflight >= self.cap:
                self.held.append((i, target))  # prepared again when released, with that time
            else:
                self._send(prepared)
            since_yield += 1
        self.scheduled_all = True

    async def run(self, start_ns: int | None = None,
                  progress: Callable[[LevelProgress], None] | None = None) -> dict:
        first = self.indices[0] if self.indices else 0
        endpoint = endpoint_url(self.url, {} if not self.payloads.n else
                                self.payloads.bodies[first])
        self.origin = Origin.from_url(endpoint)
        headers = dict(_HEADERS)
        if self.options.fresh_connection:
            headers["Connection"] = "close"
        self.head = self.origin.post_head(headers)
        self.all_done = asyncio.Event()
        t0 = time.perf_counter_ns()
        start = start_ns if start_ns is not None else t0
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        try:
            async with asyncio.TaskGroup() as tg:
                self.tg = tg
                ticker = tg.create_task(self.lag_ticker())
                prog = tg.create_task(self._progress_ticker(progress, start)) if progress else None
                await self._schedule(start)
                if self.inflight or self.held:
                    await self.all_done.wait()
                ticker.cancel()
                if prog is not None:
                    prog.cancel()
        finally:  # an interrupted level leaves no connection open
            for conn in self.conns:
                conn.close()
            self.conns.clear()
            self.idle.clear()
        t1 = time.perf_counter_ns()
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        self._parse()
        if progress:
            progress(LevelProgress(self.done, len(self.indices), self.errors, (t1 - start) / 1e9))
        cpu_s = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
        return {"proc": self.proc, "started_ns": min(t0, start), "ended_ns": t1, "cpu_s": cpu_s,
                "requests": len(self.records), "loop_lags_ns": self.lags_ns,
                "resends": self.resends}


# ----- several client processes -----

def _child(url: str, payloads: _Payloads, indices: np.ndarray, offsets: np.ndarray, warmup: int,
           options: ClientSettings, cap: int | None, proc: int, done: Any, errors: Any,
           conn: Any, parent: int) -> None:
    import uvloop

    from lab.shared.pdeath import die_with_parent

    die_with_parent(parent)  # a SIGKILLed `lab` must not leave its load clients running
    driver = _OpenDriver(url, payloads, indices, offsets, warmup, options, cap, proc, done, errors)
    sched = client_scheduling(options.client_realtime, conn)
    if sched is None:  # refused: the parent has the reason
        return
    conn.send("ready")
    start_ns = conn.recv()
    try:
        info = uvloop.run(driver.run(start_ns=start_ns))
        info["scheduling"] = sched
        conn.send(("ok", driver.records, info))
    except BaseException as exc:  # report, never hang the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}", None))
    finally:
        conn.close()


async def _run_procs(url: str, payloads: _Payloads, offsets: np.ndarray, warmup: int,
                     options: ClientSettings, cap: int | None, streams: np.ndarray, procs: int,
                     progress: Callable[[LevelProgress], None] | None
                     ) -> tuple[list[RequestRecord], list[dict]]:
    ctx = mp.get_context("spawn")
    done = ctx.Value("q", 0)
    errors = ctx.Value("q", 0)
    caps = split_share(cap, procs) if cap is not None else [None] * procs
    mine = [np.flatnonzero(streams == k) for k in range(procs)]
    args = [(url, payloads, mine[k], offsets[mine[k]], warmup, options, caps[k], k, done,
             errors) for k in range(procs)]
    return await run_client_processes(ctx, _child, args, lambda start_ns: start_ns, done,
                                      errors, len(offsets), progress,
                                      not_before_ns=options.start_at_ns)


async def run_rate_level(url: str, bodies: Sequence[dict], offsets_ns: np.ndarray, *,
                         rate: float, warmup: int = 0, max_concurrency: int | None = None,
                         seed: Sequence[int] = (0,), options: ClientSettings | None = None,
                         progress: Callable[[LevelProgress], None] | None = None,
                         remote: RemoteClients | None = None) -> LevelResult:
    """Run one open-loop level: request i of `bodies` is due `offsets_ns[i]` after the level's
    start (`arrivals.ArrivalProcess.schedule_ns`). The first `warmup` are flagged warm-up.

    With `max_concurrency`, a request due while that many are in flight is held at the client
    until one ends (its `scheduled_ns` says when). `options.client_procs` processes split the
    schedule (`split_streams`, seeded by `seed`). Records come back sorted by index, each with
    `rate` and `concurrency` 0 (no closed loop); `procs` holds each client process's own figures.
    With `remote`, its processes split the schedule instead (one stream each).
    """
    options = options or IN_PROCESS
    offsets = np.asarray(offsets_ns, dtype=np.int64)
    if len(offsets) != len(bodies):
        raise ValueError(f"{len(offsets)} intended send times for {len(bodies)} requests")
    procs = max(1, remote.streams_for() if remote is not None else options.client_procs)
    if max_concurrency is not None and max_concurrency < procs:
        raise ValueError(f"max_concurrency {max_concurrency} is below the {procs} client "
                         "processes it is split over")
    payloads = _Payloads(bodies)
    await payloads.prebuild(progress)
    if remote is not None:
        streams = split_streams(len(offsets), procs, seed)
        records, infos = await remote.open(url, payloads, offsets, warmup, options,
                                           max_concurrency, streams, progress)
    elif not options.in_process_client or procs > 1:
        streams = split_streams(len(offsets), procs, seed)
        records, infos = await _run_procs(url, payloads, offsets, warmup, options,
                                          max_concurrency, streams, procs, progress)
    else:
        driver = _OpenDriver(url, payloads, np.arange(len(offsets)), offsets, warmup, options,
                             max_concurrency)
        start = (None if options.start_at_ns is None
                 else max(options.start_at_ns, time.perf_counter_ns()))
        info = await driver.run(start, progress=progress)
        records, infos = driver.records, [info]
    records.sort(key=lambda r: r.index)
    for r in records:
        r.concurrency = 0
        r.rate = float(rate)
    return LevelResult(concurrency=0, records=records, procs=infos)
