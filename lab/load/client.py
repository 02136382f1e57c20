"""The closed-loop load client: exactly N requests in flight, per-request timing, self-measurement.

Design (what keeps it light and honest):

- ONE aiohttp session per level (a TCPConnector with limit >= concurrency; `fresh_connection`
  makes it force_close, so every request opens a new connection).
- Responses are read as raw bytes (`iter_any`); each read is stamped with `perf_counter_ns()`
  before anything else, complete SSE events are appended with that stamp, and JSON is parsed
  only after the next request of the same slot was sent (see `lab.load.sse`).
- Closed loop: each of N slot tasks claims the next request index, sends it, reads it to the
  end, and repeats. `scheduled` is the moment the slot became free (plus `gap_ms`), `sent` the
  moment the request was handed to the socket; `sent - scheduled` is the send delay.
- The client measures itself: event-loop lag (a 10 ms ticker's oversleep), CPU
  (getrusage over the level window) and send delay.
- `procs > 1` spreads the level over K spawned processes sharing one index counter, so the total
  in flight is still exactly `concurrency`; records are merged.

Failed requests are records with `error_kind` set; nothing is dropped.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import resource
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import orjson

from lab.load.sse import RawResponse, parse_response

LOOP_LAG_INTERVAL_S = 0.010
PROGRESS_INTERVAL_S = 0.5
_HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream"}


@dataclass
class ClientOptions:
    fresh_connection: bool = False  # a new TCP connection per request (force_close)
    gap_ms: float = 0.0  # idle time between a slot's response end and its next request
    timeout_s: float = 600.0  # per-request total timeout
    http_nodelay: bool = True  # TCP_NODELAY on the client's HTTP sockets
    procs: int = 1  # client processes the level is spread over
    duration_s: float | None = None  # timed level: stop claiming new requests after this long
    request_id_prefix: str = ""  # request_id = prefix + index (also sent as X-Request-Id)
    # run even a single client process as a child, so its CPU and loop-lag figures are its own
    # (not shared with whatever else the calling process runs, e.g. the launcher)
    isolate: bool = False


@dataclass
class Progress:
    done: int
    total: int | None  # None for timed levels
    errors: int
    elapsed_s: float


@dataclass
class LevelResult:
    concurrency: int
    records: list[dict] = field(default_factory=list)
    client: dict = field(default_factory=dict)


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


class _Payloads:
    """Request bytes and requested lengths by index; prebuilt for counted levels (outside the
    measured window), built on demand for timed levels."""

    def __init__(self, bodies: Sequence[dict], prebuild: bool) -> None:
        self.bodies = bodies
        self.n = len(bodies)
        self.cache: list[tuple[bytes, int | None, int | None, bool]] | None = None
        if prebuild:
            self.cache = [self._make(b) for b in bodies]

    @staticmethod
    def _make(body: dict) -> tuple[bytes, int | None, int | None, bool]:
        isl, osl = _requested(body)
        return orjson.dumps(body), isl, osl, bool(body.get("stream", False))

    def get(self, i: int) -> tuple[bytes, int | None, int | None, bool]:
        if self.cache is not None:
            return self.cache[i]
        return self._make(self.bodies[i])


class _NoDelayOffConnector(aiohttp.TCPConnector):
    """aiohttp sets TCP_NODELAY on every connection; this turns it off again (Nagle arms)."""

    async def _create_connection(self, req, traces, timeout):  # type: ignore[no-untyped-def]
        proto = await super()._create_connection(req, traces, timeout)
        sock = proto.transport.get_extra_info("socket") if proto.transport else None
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)
        return proto


async def _send(session: aiohttp.ClientSession, url: str, data: bytes, headers: dict,
                streaming: bool, after_headers: Callable[[], None]) -> RawResponse:
    perf = time.perf_counter_ns
    raw = RawResponse(sent_ns=perf())
    try:
        async with session.post(url, data=data, headers=headers) as resp:
            raw.status = resp.status
            after_headers()
            if resp.status != 200 or not streaming:
                raw.body = await resp.read()
                raw.done_ns = perf()
                return raw
            times = raw.times
            events = raw.events
            buf = b""
            async for data_in in resp.content.iter_any():
                t = perf()
                if b"\r" in data_in:
                    data_in = data_in.replace(b"\r\n", b"\n")
                buf += data_in
                if b"\n\n" in buf:
                    parts = buf.split(b"\n\n")
                    buf = parts.pop()
                    for part in parts:
                        times.append(t)
                        events.append(part)
            if buf.strip():
                times.append(perf())
                events.append(buf)
            raw.done_ns = perf()
    except TimeoutError as exc:
        raw.error_kind, raw.error_message = "timeout", f"no complete response: {exc!r}"
    except aiohttp.ClientConnectorError as exc:
        raw.error_kind, raw.error_message = "connect", str(exc)
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:
        raw.error_kind, raw.error_message = "disconnect", str(exc) or type(exc).__name__
    except aiohttp.ClientError as exc:
        raw.error_kind, raw.error_message = "client_error", f"{type(exc).__name__}: {exc}"
    except OSError as exc:
        raw.error_kind, raw.error_message = "connect", f"{type(exc).__name__}: {exc}"
    if raw.done_ns is None:
        raw.done_ns = perf()
    return raw


@dataclass
class _Shared:
    """Cross-process state of a level (or plain ints for one process)."""

    next_index: Any = None  # mp.Value('q') or None
    done: Any = None  # mp.Value('q') or None
    errors: Any = None


class _Driver:
    """One process's share of a level: `concurrency` slot tasks over a shared index counter."""

    def __init__(self, url: str, payloads: _Payloads, concurrency: int, warmup: int,
                 options: ClientOptions, shared: _Shared | None = None, proc: int = 0) -> None:
        self.url = url
        self.payloads = payloads
        self.concurrency = concurrency
        self.warmup = warmup
        self.options = options
        self.shared = shared
        self.proc = proc
        self.records: list[dict] = []
        self.lags_ns: list[int] = []
        self._next = 0
        self.done = 0
        self.errors = 0
        self.deadline_ns: int | None = None
        self._endpoint: str | None = None

    def _claim(self) -> int | None:
        if self.deadline_ns is not None and time.perf_counter_ns() >= self.deadline_ns:
            return None
        if self.shared is not None and self.shared.next_index is not None:
            with self.shared.next_index.get_lock():
                i = self.shared.next_index.value
                if i >= self.payloads.n:
                    return None
                self.shared.next_index.value = i + 1
            return i
        i = self._next
        if i >= self.payloads.n:
            return None
        self._next = i + 1
        return i

    def _finish(self, i: int, scheduled: int, isl: int | None, osl: int | None, streaming: bool,
                raw: RawResponse) -> None:
        rec = parse_response(raw, streaming)
        rec.update(
            index=i,
            request_id=f"{self.options.request_id_prefix}{i}",
            warmup=i < self.warmup,
            scheduled_ns=scheduled,
            send_delay_ms=(raw.sent_ns - scheduled) / 1e6,
            isl_requested=isl,
            osl_requested=osl,
            client_proc=self.proc,
        )
        if rec["input_tokens"] is None:
            rec["input_tokens"] = isl
            rec["input_tokens_source"] = "request"
        else:
            rec["input_tokens_source"] = "usage"
        self.records.append(rec)
        self.done += 1
        if not rec["ok"]:
            self.errors += 1
        if self.shared is not None and self.shared.done is not None:
            with self.shared.done.get_lock():
                self.shared.done.value += 1
            if not rec["ok"]:
                with self.shared.errors.get_lock():
                    self.shared.errors.value += 1

    async def _slot(self, session: aiohttp.ClientSession, start_ns: int) -> None:
        gap_ns = int(self.options.gap_ms * 1e6)
        free = start_ns
        pending: list[tuple] = []

        def flush() -> None:
            while pending:
                self._finish(*pending.pop())

        first = True
        while True:
            i = self._claim()
            if i is None:
                break
            data, isl, osl, streaming = self.payloads.get(i)
            scheduled = free if first else free + gap_ns
            first = False
            if gap_ns:
                delay = scheduled - time.perf_counter_ns()
                if delay > 0:
                    await asyncio.sleep(delay / 1e9)
            url = self._endpoint or self.url
            headers = {**_HEADERS, "X-Request-Id": f"{self.options.request_id_prefix}{i}"}
            try:
                raw = await _send(session, url, data, headers, streaming, flush)
            except Exception as exc:  # never lose a request: anything unexpected is a row
                raw = RawResponse(sent_ns=time.perf_counter_ns(), done_ns=time.perf_counter_ns(),
                                  error_kind="client_error",
                                  error_message=f"{type(exc).__name__}: {exc}")
            flush()
            free = raw.done_ns or time.perf_counter_ns()
            pending.append((i, scheduled, isl, osl, streaming, raw))
        flush()

    async def _lag_ticker(self) -> None:
        interval_ns = int(LOOP_LAG_INTERVAL_S * 1e9)
        perf = time.perf_counter_ns
        lags = self.lags_ns
        while True:
            t0 = perf()
            await asyncio.sleep(LOOP_LAG_INTERVAL_S)
            lags.append(max(0, perf() - t0 - interval_ns))

    async def _progress_ticker(self, progress: Callable[[Progress], None], start_ns: int) -> None:
        total = None if self.options.duration_s else self.payloads.n
        while True:
            await asyncio.sleep(PROGRESS_INTERVAL_S)
            progress(Progress(self.done, total, self.errors,
                              (time.perf_counter_ns() - start_ns) / 1e9))

    async def run(self, progress: Callable[[Progress], None] | None = None,
                  start_ns: int | None = None, deadline_ns: int | None = None) -> dict:
        if self.payloads.n:
            self._endpoint = endpoint_url(self.url, orjson.loads(self.payloads.get(0)[0]))
        opts = self.options
        connector_cls = aiohttp.TCPConnector if opts.http_nodelay else _NoDelayOffConnector
        connector = connector_cls(limit=max(1, self.concurrency), limit_per_host=0,
                                  force_close=opts.fresh_connection, enable_cleanup_closed=False)
        timeout = aiohttp.ClientTimeout(total=opts.timeout_s)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                         auto_decompress=False) as session:
            if start_ns is not None:
                wait = start_ns - time.perf_counter_ns()
                if wait > 0:
                    await asyncio.sleep(wait / 1e9)
            t0 = time.perf_counter_ns()
            if deadline_ns is None and opts.duration_s:
                deadline_ns = t0 + int(opts.duration_s * 1e9)
            self.deadline_ns = deadline_ns
            ru0 = resource.getrusage(resource.RUSAGE_SELF)
            async with asyncio.TaskGroup() as tg:
                ticker = tg.create_task(self._lag_ticker())
                prog = tg.create_task(self._progress_ticker(progress, t0)) if progress else None
                async with asyncio.TaskGroup() as slots:
                    for _ in range(self.concurrency):
                        slots.create_task(self._slot(session, t0))
                ticker.cancel()
                if prog is not None:
                    prog.cancel()
            t1 = time.perf_counter_ns()
            ru1 = resource.getrusage(resource.RUSAGE_SELF)
        if progress:
            progress(Progress(self.done, None if opts.duration_s else self.payloads.n,
                              self.errors, (t1 - t0) / 1e9))
        cpu_s = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
        return {
            "proc": self.proc,
            "started_ns": t0,
            "ended_ns": t1,
            "cpu_s": cpu_s,
            "wall_s": (t1 - t0) / 1e9,
            "requests": len(self.records),
            "loop_lags_ns": self.lags_ns,
        }


def _p99(values: list[float]) -> float | None:
    if not values:
        return None
    s = sorted(values)
    # exact percentile with linear interpolation (the same rule as numpy's default)
    k = (len(s) - 1) * 0.99
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarize_client(procs: list[dict], records: list[dict]) -> dict:
    """The client-health figures of a level, merged over client processes."""
    started = min(p["started_ns"] for p in procs)
    ended = max(p["ended_ns"] for p in procs)
    wall_s = max((ended - started) / 1e9, 1e-9)
    cpu_s = sum(p["cpu_s"] for p in procs)
    per_proc_pct = [100.0 * p["cpu_s"] / max(p["wall_s"], 1e-9) for p in procs]
    lags = [lag / 1e6 for p in procs for lag in p["loop_lags_ns"]]
    send = [r["send_delay_ms"] for r in records if not r["warmup"]]
    n = len(records)
    return {
        "procs": len(procs),
        "started_ns": started,
        "ended_ns": ended,
        "wall_s": wall_s,
        "cpu_s": cpu_s,
        "cpu_pct": 100.0 * cpu_s / wall_s,
        "cpu_pct_max_proc": max(per_proc_pct) if per_proc_pct else None,
        "cpu_ms_per_request": 1000.0 * cpu_s / n if n else None,
        "send_delay_p99_ms": _p99(send),
        "send_delay_max_ms": max(send) if send else None,
        "loop_lag_p99_ms": _p99(lags),
        "loop_lag_max_ms": max(lags) if lags else None,
    }


# ----- several client processes -----

def _child(url: str, payloads: _Payloads, concurrency: int, warmup: int, options: ClientOptions,
           proc: int, next_index: Any, done: Any, errors: Any, conn: Any) -> None:
    import uvloop

    shared = _Shared(next_index, done, errors)
    driver = _Driver(url, payloads, concurrency, warmup, options, shared, proc)
    conn.send("ready")
    start_ns, deadline_ns = conn.recv()
    try:
        info = uvloop.run(driver.run(start_ns=start_ns, deadline_ns=deadline_ns))
        conn.send(("ok", driver.records, info))
    except BaseException as exc:  # report, never hang the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}", None))
    finally:
        conn.close()


def _split(concurrency: int, procs: int) -> list[int]:
    procs = max(1, min(procs, concurrency))
    return [concurrency // procs + (1 if k < concurrency % procs else 0) for k in range(procs)]


async def _run_procs(url: str, payloads: _Payloads, concurrency: int, warmup: int,
                     options: ClientOptions, progress: Callable[[Progress], None] | None
                     ) -> tuple[list[dict], list[dict]]:
    ctx = mp.get_context("spawn")
    next_index = ctx.Value("q", 0)
    done = ctx.Value("q", 0)
    errors = ctx.Value("q", 0)
    shares = _split(concurrency, options.procs)
    children = []
    try:
        for k, share in enumerate(shares):
            parent_end, child_end = ctx.Pipe()
            p = ctx.Process(target=_child, name=f"lab-client-{k}", daemon=True,
                            args=(url, payloads, share, warmup, options, k, next_index, done,
                                  errors, child_end))
            p.start()
            child_end.close()
            children.append((p, parent_end))
        for p, end in children:
            msg = await asyncio.to_thread(_recv, end, p)
            if msg != "ready":
                raise RuntimeError(f"client process {p.name} failed to start: {msg}")
        start_ns = time.perf_counter_ns() + 50_000_000  # all start together, 50 ms from now
        deadline = start_ns + int(options.duration_s * 1e9) if options.duration_s else None
        for _, end in children:
            end.send((start_ns, deadline))
        waits = [asyncio.create_task(asyncio.to_thread(_recv, end, p)) for p, end in children]
        total = None if options.duration_s else payloads.n
        while not all(w.done() for w in waits):
            await asyncio.wait(waits, timeout=PROGRESS_INTERVAL_S)
            if progress:
                progress(Progress(done.value, total, errors.value,
                                  max(0.0, (time.perf_counter_ns() - start_ns) / 1e9)))
        records: list[dict] = []
        infos: list[dict] = []
        for w, (p, _) in zip(waits, children, strict=True):
            status, recs, info = w.result()
            if status != "ok":
                raise RuntimeError(f"client process {p.name} failed: {recs}")
            records.extend(recs)
            infos.append(info)
        return records, infos
    finally:
        for p, end in children:
            end.close()
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)


def _recv(conn: Any, p: Any) -> Any:
    while not conn.poll(0.2):
        if not p.is_alive():
            return ("error", f"exited with code {p.exitcode}", None)
    return conn.recv()


async def run_level(url: str, bodies: Sequence[dict], concurrency: int, *, warmup: int = 0,
                    options: ClientOptions | None = None,
                    progress: Callable[[Progress], None] | None = None) -> LevelResult:
    """Run one closed-loop level: all of `bodies` (or, with options.duration_s, as many as fit)
    with exactly `concurrency` in flight. The first `warmup` requests are flagged `warmup=True`.

    `url` is the server's base URL (the endpoint follows the body: prompt -> /v1/completions,
    messages -> /v1/chat/completions) or a full endpoint URL.
    Records come back sorted by index; `client` holds the client-health figures.
    """
    options = options or ClientOptions()
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1 (got {concurrency})")
    payloads = _Payloads(bodies, prebuild=options.duration_s is None)
    if options.isolate or (options.procs > 1 and concurrency > 1):
        records, infos = await _run_procs(url, payloads, concurrency, warmup, options, progress)
    else:
        driver = _Driver(url, payloads, concurrency, warmup, options)
        info = await driver.run(progress)
        records, infos = driver.records, [info]
    records.sort(key=lambda r: r["index"])
    for r in records:
        r["concurrency"] = concurrency
    return LevelResult(concurrency=concurrency, records=records,
                       client=summarize_client(infos, records))


def options_dict(options: ClientOptions) -> dict:
    return asdict(options)
