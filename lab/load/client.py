"""The closed-loop load client: exactly N requests in flight, per-request timing, self-measurement.

Design (what keeps it light and honest):

- HTTP/1.1 on asyncio.Protocol (`lab.load.http1`), one kept-alive connection per slot
  (`fresh_connection`: `Connection: close` and a new connection per request). Each read is
  stamped with `perf_counter_ns()` before anything else and kept as (stamp, bytes); SSE events
  are split and JSON parsed only after the next request of the same slot was sent
  (`lab.load.sse`). Against one SSE chunk per token, aiohttp's per-chunk coroutine wake-ups
  cost several times the client's CPU budget; this costs a stamp and an append per read.
- Closed loop: each of N slots claims the next request index, sends it, reads it to the end,
  and repeats; with no gap the next request is written from the completion callback itself
  (see `_Slot`). `scheduled` is the moment the slot became free (plus `gap_ms`), `sent` the
  moment the request was handed to the socket (before connecting, when a connection is
  opened); `sent - scheduled` is the send delay.
- The client measures itself: event-loop lag (a 10 ms ticker's oversleep, in ns), CPU
  (getrusage over the level window) and the stamps send delay is derived from. It stores ns
  stamps only; the analysis derives every millisecond figure once (`lab.analysis.request_times`
  per request, `lab.analysis.client_health` for the client's own figures).
- `procs > 1` spreads the level over K spawned processes sharing one index counter, so the total
  in flight is still exactly `concurrency`; records are merged.

Failed requests are records with `error_kind` set; nothing is dropped.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import resource
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from lab.load.cancel import CancelPlan
from lab.load.client_settings import IN_PROCESS, ClientSettings
from lab.load.http1 import Http1Connection, Origin, connect, post_request
from lab.load.priority import client_scheduling
from lab.load.record import RequestRecord, Sent
from lab.load.sse import RawResponse, parse_response

LOOP_LAG_INTERVAL_S = 0.010
PROGRESS_INTERVAL_S = 0.5
#: Threads that build a counted level's payloads before its first send. A prompt's HF encodes
#: run in parallel; the Python around them (words, body, JSON) holds the GIL, about a third of
#: a 4096-token prompt's time, so threads past the cores of a 2-core machine gain little.
PREBUILD_THREADS = 2
#: A prebuild times its first PREBUILD_PROBE payloads; past THREADED_BUILD_S each, it builds
#: the rest on threads (20,000 word prompts, 68 us each, take 2.5x longer on two threads).
PREBUILD_PROBE = 8
THREADED_BUILD_S = 0.0005
_HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream"}


def arm_cancel(plan: CancelPlan | None, conn: Http1Connection, raw: RawResponse,
               index: int) -> None:
    """After request `index` was written on `conn`: arm its cancel if the plan picks it. Every
    driver (closed loop, open loop) calls this once per request, only with a plan."""
    if plan is not None and plan.picks(index):
        conn.arm_cancel(raw, plan.events, plan.delay_s)


@dataclass
class LevelProgress:
    """How far a level is: what the live progress line shows (lab.load.sweep.LineProgress)."""

    done: int
    total: int | None  # None for timed levels
    errors: int
    elapsed_s: float
    #: The level's prompts are being built (before its first send): `done` of `total` built.
    building: bool = False


@dataclass
class LevelResult:
    """A level's records and what each client process measured of itself: its window
    (`started_ns`, `ended_ns`), CPU seconds (`cpu_s`) and event-loop lags (`loop_lags_ns`);
    `lab.analysis.client_health` turns them into the level's client-health figures."""

    concurrency: int
    records: list[RequestRecord] = field(default_factory=list)
    procs: list[dict] = field(default_factory=list)


class RemoteClients(Protocol):
    """Client processes somewhere else than this machine's children (`lab.load.ray_client`):
    what `run_level` and `open_loop.run_rate_level` hand a level to instead of spawning."""

    async def closed(self, url: str, payloads: _Payloads, concurrency: int, warmup: int,
                     options: ClientSettings, progress: Callable[[LevelProgress], None] | None
                     ) -> tuple[list[RequestRecord], list[dict]]: ...

    async def open(self, url: str, payloads: _Payloads, offsets: Any, warmup: int,
                   options: ClientSettings, cap: int | None, streams: Any,
                   progress: Callable[[LevelProgress], None] | None
                   ) -> tuple[list[RequestRecord], list[dict]]: ...

    def streams_for(self) -> int: ...


def endpoint_url(url: str, body: dict) -> str:
    """A base URL gets the endpoint the body is for; a URL with a /v1/... path is kept."""
    base = url.rstrip("/")
    if "/v1/" in base:
        return base
    return base + ("/v1/chat/completions" if "messages" in body else "/v1/completions")


def _requested(body: dict) -> tuple[int | None, int | None]:
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        isl: int | None = len(prompt)
    elif isinstance(prompt, str):
        isl = len(prompt.split())
    elif body.get("messages"):
        isl = sum(len(str(m.get("content", "")).split()) for m in body["messages"])
    else:
        isl = None
    return isl, body.get("max_tokens")


def build_record(raw: RawResponse, sent: Sent, *, prefix: str, warmup: bool, proc: int,
                 keep_text: bool = False) -> RequestRecord:
    """One request's record: the parsed response's stamps and counts, plus who sent it when."""
    rec = parse_response(raw, sent.streaming, keep_text)
    rec.index = sent.request_index
    rec.request_id = f"{prefix}{sent.request_index}"
    rec.warmup = warmup
    rec.scheduled_ns = sent.scheduled_ns
    rec.intended_ns = sent.intended_ns
    rec.isl_requested = sent.isl
    rec.osl_requested = sent.osl
    rec.client_proc = proc
    rec.conversation = sent.conversation
    rec.turn = sent.turn
    if rec.input_tokens is None:
        rec.input_tokens = sent.isl
        rec.input_tokens_source = "request"
    else:
        rec.input_tokens_source = "usage"
    return rec


async def connect_for(origin: Origin, options: ClientSettings,
                      raw: RawResponse) -> Http1Connection | None:
    """A new connection for the request `raw` is for, or None with `raw` failed: its error
    (`timeout` or `connect`, the message naming the origin) and its end stamped. Every driver
    (closed loop, open loop, conversations) connects through here, so a failed connect is the
    same row whichever sent it."""
    try:
        return await connect(origin, nodelay=options.http_nodelay, timeout_s=options.timeout)
    except TimeoutError as exc:
        raw.error_kind, raw.error_message = "timeout", f"connect: no connection: {exc!r}"
    except OSError as exc:
        raw.error_kind = "connect"
        raw.error_message = (f"cannot connect to {origin.host}:{origin.port}: "
                             f"{type(exc).__name__}: {exc}")
    raw.done_ns = time.perf_counter_ns()
    return None


class RecordBook:
    """What every driver keeps of its level: the records, their counts (and the level's
    cross-process counters, when given: mp.Values the parent reports progress from), and the
    event loop's lags (a LOOP_LAG_INTERVAL_S ticker's oversleep, ns)."""

    def __init__(self, options: ClientSettings, warmup: int, proc: int,
                 shared_done: Any = None, shared_errors: Any = None) -> None:
        self.options = options
        self.warmup = warmup
        self.proc = proc
        self.shared_done = shared_done
        self.shared_errors = shared_errors
        self.records: list[RequestRecord] = []
        self.lags_ns: list[int] = []
        self.done = 0
        self.errors = 0
        self.resends = 0  # requests sent again after a reused connection closed (lab.load.http1)
        self.ramp_end_ns = 0  # requests claimed before this are warm-up (--ramp-up)
        self.ramp_warmup: set[int] = set()  # with a ramp: the warm-up's request indices

    def _is_warmup(self, i: int) -> bool:
        if self.options.after_ramp is not None:
            return i in self.ramp_warmup
        return i < self.warmup

    def book(self, sent: Sent, raw: RawResponse, keep_text: bool = False,
             warmup: bool | None = None) -> RequestRecord:
        """The record of a finished request, kept and counted (warm-up: the first `warmup`
        request indices, unless told)."""
        rec = build_record(raw, sent, prefix=self.options.request_id_prefix,
                           warmup=self._is_warmup(sent.request_index) if warmup is None
                           else warmup, proc=self.proc, keep_text=keep_text)
        self.records.append(rec)
        self.done += 1
        self.resends += raw.resends
        failed = not rec.ok and not rec.cancelled  # a cancelled request is no error
        if failed:
            self.errors += 1
        if self.shared_done is not None:
            with self.shared_done.get_lock():
                self.shared_done.value += 1
            if failed:
                with self.shared_errors.get_lock():
                    self.shared_errors.value += 1
        return rec

    async def lag_ticker(self) -> None:
        interval_ns = int(LOOP_LAG_INTERVAL_S * 1e9)
        perf = time.perf_counter_ns
        lags = self.lags_ns
        while True:
            t0 = perf()
            await asyncio.sleep(LOOP_LAG_INTERVAL_S)
            lags.append(max(0, perf() - t0 - interval_ns))


#: A request's bytes, its requested ISL and OSL, and whether it streams.
_Payload = tuple[bytes, int | None, int | None, bool]


class _Payloads:
    """Request bytes and requested lengths by index; prebuilt for counted levels (outside the
    measured window, `await payloads.prebuild(progress)`), built on demand for timed levels.
    An on-demand build happens before the request's send stamp: synthesizing a prompt of
    exact length is the client's time (about 0.5 ms at 136 tokens and 12 ms at 4096 with a
    HuggingFace tokenizer), not the server's."""

    def __init__(self, bodies: Sequence[dict]) -> None:
        self.bodies = bodies
        self.n = len(bodies)
        # a workload's RequestSet knows the lengths it asked for in its own tokenizer; a plain
        # list of bodies is measured from the bodies (token ids, or whitespace-separated words)
        self.requested = getattr(bodies, "requested", None)
        self.cache: list[_Payload] | None = None

    async def prebuild(self, progress: Callable[[LevelProgress], None] | None) -> None:
        """Build every payload before the level's first send, off the event loop, so that a
        signal still ends the run at once. Long prompts take a while (576 of 4096 tokens:
        ~3.4 s with a HuggingFace tokenizer), so `progress` hears how many are built, every
        PROGRESS_INTERVAL_S (`LevelProgress.building`)."""
        loop = asyncio.get_running_loop()
        report: Callable[[LevelProgress], None] | None = None
        if progress is not None:
            def report(p: LevelProgress) -> None:  # heard on the loop, not the build thread
                loop.call_soon_threadsafe(progress, p)
        stop = threading.Event()
        try:
            self.cache = await asyncio.to_thread(self._build_all, report, stop)
        finally:
            stop.set()  # cancelled: the build thread stops at its next payload

    def _build_all(self, report: Callable[[LevelProgress], None] | None,
                   stop: threading.Event) -> list[_Payload] | None:
        cache: list[_Payload] = []
        start = time.monotonic()
        report_at = start + PROGRESS_INTERVAL_S
        # The first payloads one by one (the first loads the tokenizer and builds the shared
        # prefix). If they are slow, they are a HuggingFace tokenizer's encodes, which let go
        # of the GIL (lab/load/corpus.py): the rest then build on PREBUILD_THREADS threads,
        # 576 prompts of 4096 tokens in 3.4 s instead of 6.8
        # (docs/measurements.md "Building a level's prompts").
        # Faster builds are Python, which threads would only serialize.
        if self.n:
            cache.append(self._make(0))
        lone = min(self.n, PREBUILD_PROBE)
        probe_start = time.perf_counter()
        cache += [self._make(i) for i in range(1, lone)]
        slow = lone > 1 and (time.perf_counter() - probe_start) / (lone - 1) >= THREADED_BUILD_S
        rest = range(lone, self.n)
        pool = ThreadPoolExecutor(PREBUILD_THREADS, thread_name_prefix="prebuild") if slow else None
        try:
            built = pool.map(self._make, rest) if pool is not None else map(self._make, rest)
            for i, payload in enumerate(built, start=lone + 1):
                if stop.is_set():
                    return None
                cache.append(payload)
                if report is not None and (now := time.monotonic()) >= report_at:
                    report(LevelProgress(i, self.n, 0, now - start, building=True))
                    report_at = now + PROGRESS_INTERVAL_S
        finally:
            if pool is not None:
                pool.shutdown(cancel_futures=True)  # stopped or failed: the rest is dropped
        return cache

    def _make(self, i: int) -> _Payload:
        body = self.bodies[i]
        isl, osl = self.requested(i) if self.requested is not None else _requested(body)
        return orjson.dumps(body), isl, osl, bool(body.get("stream", False))

    def get(self, i: int) -> _Payload:
        if self.cache is not None:
            return self.cache[i]
        return self._make(i)


@dataclass
class _Shared:
    """Cross-process state of a level (or plain ints for one process)."""

    next_index: Any = None  # mp.Value('q') or None
    done: Any = None  # mp.Value('q') or None
    errors: Any = None


class _Driver(RecordBook):
    """One process's share of a level: `concurrency` slot tasks over a shared index counter."""

    def __init__(self, url: str, payloads: _Payloads, concurrency: int, warmup: int,
                 options: ClientSettings, shared: _Shared | None = None, proc: int = 0,
                 indices: Sequence[int] | None = None) -> None:
        super().__init__(options, warmup, proc, shared.done if shared else None,
                         shared.errors if shared else None)
        self.url = url
        self.payloads = payloads
        self.concurrency = concurrency
        self.shared = shared
        # the request indices this driver claims, in order (default: all of `payloads`); a
        # driver that shares no counter with the others (a Ray actor) gets its own share
        self.indices: Sequence[int] = range(payloads.n) if indices is None else indices
        self._next = 0
        self.deadline_ns: int | None = None
        self._endpoint: str | None = None
        self.rid_prefix = options.request_id_prefix.encode()
        self.origin: Origin | None = None
        self.head = b""
        self.gap_ns = 0
        self.chain = False
        self.claimed_after_ramp = 0
        self.cancel = options.cancels()

    def claim(self) -> int | None:
        if self.deadline_ns is not None and time.perf_counter_ns() >= self.deadline_ns:
            return None
        after = self.options.after_ramp
        if after is None:
            return self._claim_index()
        ramping = time.perf_counter_ns() < self.ramp_end_ns
        if not ramping and self.claimed_after_ramp >= after:
            return None
        i = self._claim_index()
        if i is not None:
            if ramping or self.claimed_after_ramp < self.warmup:  # the ramp, then --warmup
                self.ramp_warmup.add(i)
            if not ramping:
                self.claimed_after_ramp += 1
        return i

    def _claim_index(self) -> int | None:
        if self.shared is not None and self.shared.next_index is not None:
            with self.shared.next_index.get_lock():
                i = self.shared.next_index.value
                if i >= self.payloads.n:
                    return None
                self.shared.next_index.value = i + 1
            return i
        k = self._next
        if k >= len(self.indices):
            return None
        self._next = k + 1
        return self.indices[k]

    def finish(self, sent: Sent, raw: RawResponse) -> None:
        self.book(sent, raw)

    async def _progress_ticker(self, progress: Callable[[LevelProgress], None],
                               start_ns: int) -> None:
        total = (None if self.options.duration_s or self.options.after_ramp is not None
                 else self.payloads.n)
        while True:
            await asyncio.sleep(PROGRESS_INTERVAL_S)
            progress(LevelProgress(self.done, total, self.errors,
                              (time.perf_counter_ns() - start_ns) / 1e9))

    async def run(self, progress: Callable[[LevelProgress], None] | None = None,
                  start_ns: int | None = None, deadline_ns: int | None = None) -> dict:
        opts = self.options
        if self.payloads.n:
            self._endpoint = endpoint_url(self.url, orjson.loads(self.payloads.get(0)[0]))
        self.origin = Origin.from_url(self._endpoint or endpoint_url(self.url, {}))
        headers = dict(_HEADERS)
        if opts.fresh_connection:
            headers["Connection"] = "close"
        self.head = self.origin.post_head(headers)
        self.gap_ns = int(opts.gap_ms * 1e6)
        self.chain = self.gap_ns == 0 and not opts.fresh_connection
        if start_ns is not None:
            wait = start_ns - time.perf_counter_ns()
            if wait > 0:
                await asyncio.sleep(wait / 1e9)
        t0 = time.perf_counter_ns()
        if deadline_ns is None and opts.duration_s:
            deadline_ns = t0 + int(opts.duration_s * 1e9)
        self.deadline_ns = deadline_ns
        ramp_ns = int(opts.ramp_up_s * 1e9)
        self.ramp_end_ns = t0 + ramp_ns
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        async with asyncio.TaskGroup() as tg:
            ticker = tg.create_task(self.lag_ticker())
            prog = tg.create_task(self._progress_ticker(progress, t0)) if progress else None
            async with asyncio.TaskGroup() as slots:
                for k in range(self.concurrency):  # spread over the ramp, if any
                    slots.create_task(_Slot(self).run(t0 + ramp_ns * k // self.concurrency))
            ticker.cancel()
            if prog is not None:
                prog.cancel()
        t1 = time.perf_counter_ns()
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        if progress:
            progress(LevelProgress(self.done, None if opts.duration_s else self.payloads.n,
                              self.errors, (t1 - t0) / 1e9))
        cpu_s = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
        return {
            "proc": self.proc,
            "started_ns": t0,
            "ended_ns": t1,
            "cpu_s": cpu_s,
            "requests": len(self.records),
            "loop_lags_ns": self.lags_ns,
            "resends": self.resends,
        }


class _Slot:
    """One closed-loop slot: one request in flight at a time, on the slot's own connection.

    When it can (a kept-alive connection and no gap), the next request is written from the
    previous response's completion callback, inside the read that completed it: nothing waits
    for a task wake-up between a response's last byte and the next request, so the send delay
    stays in microseconds however busy the loop is. The slot's task does everything else:
    connecting, gaps, and parsing finished responses (after the next request is already out).
    """

    def __init__(self, driver: _Driver) -> None:
        self.driver = driver
        self.conn: Http1Connection | None = None
        self.current: Sent | None = None
        self.finished: list[tuple[Sent, RawResponse]] = []
        self.stalled = True  # no request in flight and none will be written by a callback
        self.free_ns = 0
        self.waiter: asyncio.Future | None = None
        self.stopped = False

    def _write(self, conn: Http1Connection, i: int, payload: _Payload, scheduled: int,
               raw: RawResponse, timeout_s: float) -> None:
        d = self.driver
        data, isl, osl, streaming = payload
        self.current = Sent(i, None, scheduled, isl, osl, streaming)
        rid = b"X-Request-Id: %s%d\r\n" % (d.rid_prefix, i)
        conn.request(post_request(d.head, rid, data), raw, streaming, self.on_response,
                     timeout_s)
        if d.cancel is not None:
            arm_cancel(d.cancel, conn, raw, i)

    def on_response(self, conn: Http1Connection, raw: RawResponse, reusable: bool) -> None:
        """Called by the connection when the current response is complete or failed."""
        current = self.current
        if current is None or self.stopped:
            return
        self.current = None
        self.finished.append((current, raw))
        d = self.driver
        if reusable and d.options.fresh_connection:
            conn.close()
            reusable = False
        if not reusable:
            if self.conn is conn:
                self.conn = None
        else:
            self.conn = conn  # a resent request is answered on a new connection (lab.load.http1)
        i = d.claim() if reusable and d.chain else None
        if i is not None:
            payload = d.payloads.get(i)  # before the send stamp (see `_Payloads`)
            self._write(conn, i, payload, raw.done_ns or time.perf_counter_ns(),
                        RawResponse(sent_ns=time.perf_counter_ns()), d.options.timeout)
        else:
            self.stalled = True
            self.free_ns = raw.done_ns or time.perf_counter_ns()
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _parse(self) -> None:
        finished, self.finished = self.finished, []
        for sent, raw in finished:
            self.driver.finish(sent, raw)

    async def _connect(self, raw: RawResponse) -> Http1Connection | None:
        d = self.driver
        assert d.origin is not None  # set when the level starts, before any slot
        self.conn = await connect_for(d.origin, d.options, raw)
        return self.conn

    async def run(self, start_ns: int) -> None:
        d = self.driver
        loop = asyncio.get_running_loop()
        perf = time.perf_counter_ns
        scheduled = start_ns
        if start_ns > perf():  # a slot of a --ramp-up starts later than the level
            await asyncio.sleep((start_ns - perf()) / 1e9)
        try:
            while True:
                i = d.claim()
                if i is None:
                    break
                if d.gap_ns:
                    delay = scheduled - perf()
                    if delay > 0:
                        await asyncio.sleep(delay / 1e9)
                payload = d.payloads.get(i)  # before the send stamp (see `_Payloads`)
                raw = RawResponse(sent_ns=perf())  # like a user's clock: connecting counts
                try:
                    conn = self.conn
                    if conn is not None and conn.stale(raw.sent_ns):  # idle past keep-alive
                        conn.close()
                    if conn is None or conn.closed:
                        conn = await self._connect(raw)
                    if conn is not None:
                        self.stalled = False
                        remaining = d.options.timeout - (perf() - raw.sent_ns) / 1e9
                        self._write(conn, i, payload, scheduled, raw, max(remaining, 1e-3))
                except Exception as exc:  # never lose a request: anything unexpected is a row
                    raw.error_kind = "client_error"
                    raw.error_message = f"{type(exc).__name__}: {exc}"
                    raw.done_ns = perf()
                    conn = None
                    self.current = None
                    if self.conn is not None:
                        self.conn.close()
                        self.conn = None
                if conn is None:
                    _, isl, osl, streaming = payload
                    self.finished.append((Sent(i, None, scheduled, isl, osl, streaming), raw))
                    self.free_ns = raw.done_ns or perf()
                    self.stalled = True
                while True:
                    if self.finished:
                        self._parse()
                    if self.stalled:
                        break
                    self.waiter = loop.create_future()
                    await self.waiter
                    self.waiter = None
                scheduled = self.free_ns + d.gap_ns
        finally:
            self.stopped = True
            if self.conn is not None:
                self.conn.close()
                self.conn = None
        self._parse()


# ----- several client processes -----

def _child(url: str, payloads: _Payloads, concurrency: int, warmup: int, options: ClientSettings,
           proc: int, next_index: Any, done: Any, errors: Any, conn: Any, parent: int) -> None:
    import uvloop

    from lab.shared.pdeath import die_with_parent

    die_with_parent(parent)  # a SIGKILLed `lab` must not leave its load clients running
    shared = _Shared(next_index, done, errors)
    driver = _Driver(url, payloads, concurrency, warmup, options, shared, proc)
    sched = client_scheduling(options.client_realtime, conn)
    if sched is None:  # refused: the parent has the reason
        return
    conn.send("ready")
    start_ns, deadline_ns = conn.recv()
    try:
        info = uvloop.run(driver.run(start_ns=start_ns, deadline_ns=deadline_ns))
        info["scheduling"] = sched
        conn.send(("ok", driver.records, info))
    except BaseException as exc:  # report, never hang the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}", None))
    finally:
        conn.close()


def _spread(total: int, parts: int) -> list[int]:
    """`total` over `parts` as evenly as it goes."""
    return [total // parts + (1 if k < total % parts else 0) for k in range(parts)]


def split_share(concurrency: int, procs: int) -> list[int]:
    """`concurrency` spread as evenly as it goes over at most `procs` processes."""
    procs = max(1, min(procs, concurrency))
    return [concurrency // procs + (1 if k < concurrency % procs else 0) for k in range(procs)]


class ShareIndices(Sequence[int]):
    """The request indices of one process's share when the processes share no counter: of every
    `concurrency` consecutive indices, the `share` starting at `first` (the process's slots
    among the level's), so every process gets requests in proportion to its slots and the
    warm-up (the first indices) is spread over them like the slots are. Lazy: a timed level's
    10**9 indices cost nothing."""

    def __init__(self, n: int, concurrency: int, first: int, share: int) -> None:
        self.concurrency, self.first, self.share = concurrency, first, share
        rounds, rest = divmod(n, concurrency)
        self.n = rounds * share + min(share, max(0, rest - first))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, k: int) -> int:  # type: ignore[override]
        if not 0 <= k < self.n:
            raise IndexError(k)
        rnd, j = divmod(k, self.share)
        return rnd * self.concurrency + self.first + j


def share_indices(n: int, concurrency: int, procs: int) -> list[ShareIndices]:
    """`split_share(concurrency, procs)`'s shares as disjoint index sets covering range(n)."""
    shares = split_share(concurrency, procs)
    firsts = [sum(shares[:k]) for k in range(len(shares))]
    return [ShareIndices(n, concurrency, f, s) for f, s in zip(firsts, shares, strict=True)]


#: How long a client process gets to exit (after its level, or after terminate()) before it
#: is killed.
CLIENT_JOIN_TIMEOUT_S = 5.0


#: Start of a multi-process level: every process begins this long after the last is ready.
START_DELAY_NS = 100_000_000


async def _run_procs(url: str, payloads: _Payloads, concurrency: int, warmup: int,
                     options: ClientSettings, progress: Callable[[LevelProgress], None] | None
                     ) -> tuple[list[RequestRecord], list[dict]]:
    ctx = mp.get_context("spawn")
    next_index = ctx.Value("q", 0)
    done = ctx.Value("q", 0)
    errors = ctx.Value("q", 0)
    shares = split_share(concurrency, options.client_procs)
    args = [(url, payloads, share, warmup, options, k, next_index, done, errors)
            for k, share in enumerate(shares)]
    if options.after_ramp is not None:  # each process sends its part after the ramp
        afters, warms = _spread(options.after_ramp, len(shares)), _spread(warmup, len(shares))
        args = [(url, payloads, share, warms[k],
                 options.model_copy(update={"after_ramp": afters[k]}), k,
                 next_index, done, errors) for k, share in enumerate(shares)]

    def start_message(start_ns: int) -> tuple[int, int | None]:
        deadline = start_ns + int(options.duration_s * 1e9) if options.duration_s else None
        return start_ns, deadline

    total = None if options.duration_s or options.after_ramp is not None else payloads.n
    return await run_client_processes(ctx, _child, args, start_message, done, errors, total,
                                      progress, not_before_ns=options.start_at_ns)


async def run_client_processes(ctx: Any, target: Callable[..., None], args: list[tuple],
                               start_message: Callable[[int], Any], done: Any, errors: Any,
                               total: int | None, progress: Callable[[LevelProgress], None] | None,
                               not_before_ns: int | None = None
                               ) -> tuple[list[RequestRecord], list[dict]]:
    """Start one client process per `args` entry (`target(*args, pipe, parent_pid)`), wait
    until each says "ready", send each `start_message(start_ns)` (one start for all, no earlier
    than `not_before_ns`), report
    progress from the shared `done`/`errors` counters, and return the records and client infos
    of all. Interrupted or failed: every child is terminated, then killed, and joined."""
    children = []
    stop = threading.Event()  # tells the threads waiting on children's pipes to give up
    completed = False
    try:
        for k, child_args in enumerate(args):
            parent_end, child_end = ctx.Pipe()
            p = ctx.Process(target=target, name=f"lab-client-{k}", daemon=True,
                            args=(*child_args, child_end, os.getpid()))
            p.start()
            child_end.close()
            children.append((p, parent_end))
        for p, end in children:
            msg = await asyncio.to_thread(_recv, end, p, stop)
            if msg != "ready":
                raise RuntimeError(f"client process {p.name} failed to start: {msg}")
        start_ns = max(time.perf_counter_ns() + START_DELAY_NS, not_before_ns or 0)
        for _, end in children:
            end.send(start_message(start_ns))
        async with asyncio.TaskGroup() as tg:
            waits = [tg.create_task(asyncio.to_thread(_recv, end, p, stop))
                     for p, end in children]
            while not all(w.done() for w in waits):
                await asyncio.wait(waits, timeout=PROGRESS_INTERVAL_S)
                if progress:
                    progress(LevelProgress(done.value, total, errors.value,
                                      max(0.0, (time.perf_counter_ns() - start_ns) / 1e9)))
        records: list[RequestRecord] = []
        infos: list[dict] = []
        for w, (p, _) in zip(waits, children, strict=True):
            status, recs, info = w.result()
            if status != "ok":
                raise RuntimeError(f"client process {p.name} failed: {recs}")
            records.extend(recs)
            infos.append(info)
        completed = True
        return records, infos
    finally:
        stop.set()
        for p, end in children:
            if not completed and p.is_alive():
                p.terminate()  # interrupted (Ctrl-C, SIGTERM) or failed: the level is over
            p.join(timeout=CLIENT_JOIN_TIMEOUT_S)
            if p.is_alive():
                p.kill()
                p.join(timeout=CLIENT_JOIN_TIMEOUT_S)
            end.close()


def _recv(conn: Any, p: Any, stop: threading.Event) -> Any:
    """Wait (in a worker thread) for a child's message, its death, or `stop`."""
    while not conn.poll(0.2):
        if stop.is_set():
            return ("error", "stopped", None)
        if not p.is_alive():
            return ("error", f"exited with code {p.exitcode}", None)
    return conn.recv()


async def run_level(url: str, bodies: Sequence[dict], concurrency: int, *, warmup: int = 0,
                    options: ClientSettings | None = None,
                    progress: Callable[[LevelProgress], None] | None = None,
                    remote: RemoteClients | None = None) -> LevelResult:
    """Run one closed-loop level: all of `bodies` (or, with options.duration_s, as many as fit)
    with exactly `concurrency` in flight. The first `warmup` requests are flagged `warmup=True`.

    `url` is the server's base URL (the endpoint follows the body: prompt -> /v1/completions,
    messages -> /v1/chat/completions) or a full endpoint URL.
    Records come back sorted by index (stamps and counts, no millisecond figure); `procs`
    holds each client process's own measurements (ns stamps, CPU seconds). With `remote`
    the level runs on its client processes (`options.client_procs` is theirs to decide).
    """
    options = options or IN_PROCESS
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1 (got {concurrency})")
    payloads = _Payloads(bodies)
    if options.duration_s is None and options.after_ramp is None:
        await payloads.prebuild(progress)
    if remote is not None:
        records, infos = await remote.closed(url, payloads, concurrency, warmup, options,
                                             progress)
    elif not options.in_process_client or (options.client_procs > 1 and concurrency > 1):
        records, infos = await _run_procs(url, payloads, concurrency, warmup, options, progress)
    else:
        driver = _Driver(url, payloads, concurrency, warmup, options)
        info = await driver.run(progress, start_ns=options.start_at_ns)
        records, infos = driver.records, [info]
    records.sort(key=lambda r: r.index)
    for r in records:
        r.concurrency = concurrency
    return LevelResult(concurrency=concurrency, records=records, procs=infos)
