"""Drive a concurrency (or request-rate) sweep against an OpenAI URL and write the run
directory as it goes.

This is the launcher-free half of `lab sweep` (the command wraps it in a Stack, or points it at
--target). After every level: requests.parquet (rewritten atomically with all completed levels),
client.json and levels.csv/json are on disk, so an interrupted sweep keeps what it measured.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from lab.analysis import rundir
from lab.analysis.checks import failed_sentence
from lab.analysis.client_health import client_health
from lab.analysis.levels import level_key
from lab.analysis.metrics import summarize_run
from lab.analysis.request_times import requests_frame
from lab.analysis.slo_share import DEFAULT_SLO_SHARE, SLOs
from lab.load.client import LevelProgress, LevelResult, RemoteClients, run_level
from lab.load.client_settings import ClientSettings
from lab.load.conversation import Conversations, run_conversation_level
from lab.load.record import RequestRecord, rows
from lab.load.stream_share import PickedRequests, StreamShare
from lab.load.trace import TraceRequest, TraceRequestSet, offered_rate, offsets_ns
from lab.load.workload import RequestSet, WorkloadSpec
from lab.open_loop.arrivals import ArrivalProcess, schedule_seed
from lab.open_loop.client import run_rate_level
from lab.open_loop.ramp import ramp_schedule
from lab.open_loop.rate_search import AUTO_CONCURRENCY, MAX_LEVELS, next_concurrency, next_rate

TIMED_LEVEL_MAX_REQUESTS = 10**9  # a timed level draws from a lazy, effectively endless set


def default_requests(concurrency: int) -> int:
    """Requests per level when --requests is not given: enough rounds of the closed loop to
    measure a steady state, small enough that the default sweep takes a minute or two."""
    return max(100, 8 * concurrency)


def level_seed(concurrency: int, repeat: int) -> int:
    return concurrency * 1000 + repeat


#: Seconds of arrivals per open-loop level when neither --requests nor --duration is given.
DEFAULT_RATE_LEVEL_S = 10.0


def default_rate_requests(rate: float) -> int:
    """Requests per open-loop level by default: DEFAULT_RATE_LEVEL_S of arrivals, at least 100."""
    return max(100, round(DEFAULT_RATE_LEVEL_S * rate))


def rate_label(rate: float) -> str:
    return f"rate={rate:g}/s"


@dataclass
class TracePlan:
    """--trace: the trace's requests and how to replay them (lab.load.trace)."""

    path: str
    requests: list[TraceRequest]
    speed: float = 1.0
    block_size: int = 512
    id_max: int | None = None  # the --tokenizer's highest token id (prompts stay in its vocab)

    @property
    def rate(self) -> float:
        return offered_rate(self.requests, self.speed)

    def to_dict(self) -> dict:
        return {"path": self.path, "requests": len(self.requests), "speed": self.speed,
                "block_size": self.block_size, "offered_req_s": self.rate}


@dataclass
class SweepPlan:
    concurrency: list[int]
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    requests: int | None = None  # per level (None: default_requests(c))
    duration_s: float | None = None  # per level, instead of a request count
    warmup: int | None = None  # per level (None: one request per slot = the concurrency)
    repeat: int = 1
    client: ClientSettings = field(default_factory=ClientSettings)
    # open loop (docs/open-loop.md): request rates instead of concurrency levels
    rates: list[float] | None = None
    arrival: ArrivalProcess = field(default_factory=ArrivalProcess)
    max_concurrency: int | None = None
    rate_auto: bool = False  # --rate auto: search the saturation rate (lab.open_loop.rate_search)
    trace: TracePlan | None = None  # --trace: replay a trace instead of levels
    # --turns/--think-ms: a level's requests are conversations' turns (lab.load.conversation)
    conversations: Conversations = field(default_factory=Conversations)
    # --shard I/N of a rate level: this client's stream of the level's schedule
    share: StreamShare | None = None
    # --shard with --barrier: the first level's start (perf_counter_ns) the shards agreed on
    start_at_ns: int | None = None
    # the SLOs (--slo-*): goodput, and the pass criterion of a search (lab.analysis.slo_share)
    slos: SLOs = field(default_factory=SLOs)
    slo_share: float = DEFAULT_SLO_SHARE  # the share of good requests a search level needs
    conc_auto: bool = False  # --conc auto: search the SLO edge over concurrency
    max_levels: int = MAX_LEVELS  # --rate auto / --conc auto: search levels at most
    ramp_up_s: float = 0.0  # --ramp-up: each level ramps up this long before it is measured

    def requests_for(self, c: int) -> int:
        return self.requests if self.requests is not None else default_requests(c)

    def warmup_for(self, c: int) -> int:
        """--warmup, or one request per slot (none after a --ramp-up: the ramp warmed up)."""
        if self.warmup is not None:
            return self.warmup
        return 0 if self.ramp_up_s else c

    def levels(self) -> list[tuple[int, int]]:
        return [(c, r) for c in self.concurrency for r in range(self.repeat)]

    def rate_levels(self) -> list[tuple[float, int]]:
        return [(rate, r) for rate in self.rates or [] for r in range(self.repeat)]

    def to_dict(self) -> dict:
        shape = self._shape_dict()
        if self.ramp_up_s:
            shape["ramp_up_s"] = self.ramp_up_s
        if self.conc_auto or self.rate_auto:
            shape["search"] = {"axis": "concurrency" if self.conc_auto else "rate",
                               "slo_share": self.slo_share if self.slos.given() else None,
                               "max_levels": self.max_levels}
        if self.conversations.turns > 1:
            shape["conversations"] = self.conversations.to_dict()
        return shape

    def _shape_dict(self) -> dict:
        if self.trace is not None:
            return {**self._rate_dict(), "rates": [self.trace.rate],
                    "requests_per_level": {f"{self.trace.rate:g}": len(self.trace.requests)},
                    "arrival": "trace", "trace": self.trace.to_dict()}
        if self.rates or self.rate_auto:
            return self._rate_dict()
        return {
            "concurrency": self.concurrency,
            "workload": self.workload.to_dict(),
            "requests": self.requests,
            "requests_per_level": {str(c): self.requests_for(c) for c in self.concurrency}
            if self.duration_s is None else None,
            "duration_s": self.duration_s,
            "warmup": self.warmup,
            "warmup_per_level": {str(c): self.warmup_for(c) for c in self.concurrency},
            "repeat": self.repeat,
            "client": self.client.model_dump(mode="json"),
            "client_procs": self.client.client_procs,
        }


    def _rate_dict(self) -> dict:
        return {
            "concurrency": [],
            "rates": "auto" if self.rate_auto else self.rates,
            "arrival": str(self.arrival),
            "max_concurrency": self.max_concurrency,
            "workload": self.workload.to_dict(),
            "requests": self.requests,
            "requests_per_level": {f"{r:g}": self.requests or default_rate_requests(r)
                                   for r in self.rates or []}
            if self.duration_s is None else None,
            "duration_s": self.duration_s,
            "warmup": self.warmup or 0,
            "repeat": self.repeat,
            "client": self.client.model_dump(mode="json"),
            "client_procs": self.client.client_procs,
        }


class LineProgress:
    """A live progress line per level on stderr (\\r-updated on a terminal, one line otherwise)."""

    def __init__(self, quiet: bool = False, stream=None) -> None:
        self.quiet = quiet
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.label = ""

    def start(self, label: str) -> None:
        self.label = label

    def _line(self, p: LevelProgress) -> str:
        total = f"/{p.total}" if p.total is not None else ""
        if p.building:
            return f"{self.label}: building prompts {p.done}{total}, {p.elapsed_s:.1f} s"
        rate = p.done / p.elapsed_s if p.elapsed_s > 0 else 0.0
        return (f"{self.label}: {p.done}{total} requests, {rate:,.1f} req/s, "
                f"{p.errors} errors, {p.elapsed_s:.1f} s")

    def update(self, p: LevelProgress) -> None:
        if self.quiet or not self.tty:
            return
        self.stream.write("\r" + self._line(p).ljust(78))
        self.stream.flush()

    def done(self, text: str) -> None:
        if self.quiet:
            return
        if self.tty:
            self.stream.write("\r" + " " * 78 + "\r")
        self.stream.write(text + "\n")
        self.stream.flush()


class SweepRunner:
    def __init__(self, run_dir: Path, url: str, model: str, plan: SweepPlan, *,
                 progress: LineProgress | None = None,
                 procs_samples: Callable[[], list[dict]] | None = None,
                 on_level: Callable[[int, int, LevelResult], None] | None = None,
                 remote: RemoteClients | None = None,
                 after_level: Callable[[str], Awaitable[None]] | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.remote = remote  # client processes elsewhere (lab.load.ray_client), or None
        self.url = url
        self.model = model
        self.plan = plan
        self.progress = progress or LineProgress(quiet=True)
        self.procs_samples = procs_samples
        self.on_level = on_level
        # awaited after each level is saved, with its label: the launched stack's leak check
        # (lab.sweep.leak_check), which raises to stop the sweep
        self.after_level = after_level
        self.writer = rundir.RequestsWriter(self.run_dir)
        self.clients: dict[str, dict] = {}
        self.records: list[RequestRecord] = []
        self.run_id = self.run_dir.name
        self.started_ns: int | None = None
        self.last_row: pd.Series | None = None  # the levels.csv row of the last level run

    async def run_one(self, concurrency: int, repeat: int) -> LevelResult:
        plan = self.plan
        warmup = plan.warmup_for(concurrency)
        seed = level_seed(concurrency, repeat)
        # a timed level draws from an effectively endless lazy set; its first `warmup`
        # requests are the warm-up, as in a counted level
        n = (warmup + plan.requests_for(concurrency)
             if plan.duration_s is None and not plan.ramp_up_s else TIMED_LEVEL_MAX_REQUESTS)
        # a ramp's requests come first, as many as fit: then `after` more (lab.load.client)
        after = None if not plan.ramp_up_s else (
            warmup + plan.requests_for(concurrency) if plan.duration_s is None
            else TIMED_LEVEL_MAX_REQUESTS)
        bodies = RequestSet(plan.workload, self.model, seed, n)
        options = plan.client.model_copy(update=dict(
            duration_s=plan.duration_s and plan.duration_s + plan.ramp_up_s,
            ramp_up_s=plan.ramp_up_s, after_ramp=after,
            request_id_prefix=f"c{concurrency}-r{repeat}-"))
        label = f"c={concurrency}" + (f" (repeat {repeat + 1}/{plan.repeat})"
                                      if plan.repeat > 1 else "")
        self.progress.start(label)
        options = self._first_level_start(options)
        if plan.conversations.turns > 1:
            n_conv = plan.requests_for(concurrency) + warmup
            result = await run_conversation_level(
                self.url, plan.workload, self.model, seed, plan.conversations, n_conv,
                concurrency=concurrency, warmup=warmup, options=options,
                progress=self.progress.update)
            self.last_row = self._save(concurrency, repeat, result)
            await self._after(label)
            return result
        result = await run_level(self.url, bodies, concurrency, warmup=warmup, options=options,
                                 progress=self.progress.update, remote=self.remote)
        self.last_row = self._save(concurrency, repeat, result)
        await self._after(label)
        return result

    async def _after(self, label: str) -> None:
        if self.after_level is not None:
            await self.after_level(label)

    def _first_level_start(self, options: ClientSettings) -> ClientSettings:
        """The sweep's first level starts at `plan.start_at_ns` (the shards' agreed start),
        if any; the others when their client is ready."""
        if self.started_ns is not None:
            return options
        self.started_ns = time.perf_counter_ns()
        return options.model_copy(update=dict(start_at_ns=self.plan.start_at_ns))

    async def run_rate(self, rate: float, repeat: int) -> LevelResult:
        """One open-loop level: its seeded schedule (--requests arrivals, or those within
        --duration), sent at the intended times (`lab.open_loop.client`)."""
        plan = self.plan
        warmup = plan.warmup or 0
        seed = schedule_seed(plan.workload.seed, rate, repeat)
        if plan.duration_s is None:
            n = warmup + (plan.requests or default_rate_requests(rate))
        else:
            n = plan.arrival.count_within(rate, plan.duration_s, seed)
        offsets = plan.arrival.schedule_ns(rate, n, seed)
        if plan.ramp_up_s:  # the rate grows from 0 first; its arrivals are warm-up
            offsets, in_ramp = ramp_schedule(
                plan.arrival, rate, seed, plan.ramp_up_s, duration_s=plan.duration_s,
                measured=None if plan.duration_s is not None else n)
            n = len(offsets)
            warmup += in_ramp
        bodies = RequestSet(plan.workload, self.model, level_seed(round(rate * 1000), repeat), n)
        options = plan.client.model_copy(update=dict(
            duration_s=None, request_id_prefix=f"r{rate:g}-r{repeat}-"))
        label = rate_label(rate) + (f" (repeat {repeat + 1}/{plan.repeat})"
                                    if plan.repeat > 1 else "")
        self.progress.start(label)
        options = self._first_level_start(options)
        if plan.conversations.turns > 1:
            result = await run_conversation_level(
                self.url, plan.workload, self.model, level_seed(round(rate * 1000), repeat),
                plan.conversations, n, offsets_ns=offsets, rate=rate, warmup=warmup,
                options=options, progress=self.progress.update)
            self.last_row = self._save(0, repeat, result, rate)
            await self._after(label)
            return result
        share = plan.share
        if share is None:
            result = await run_rate_level(self.url, bodies, offsets, rate=rate, warmup=warmup,
                                          max_concurrency=plan.max_concurrency, seed=seed,
                                          options=options, progress=self.progress.update,
                                          remote=self.remote)
        else:  # this shard's stream of the level's schedule (lab.load.stream_share)
            mine = share.pick(n, seed)
            options = options.model_copy(update=dict(
                request_id_prefix=f"{options.request_id_prefix}s{share.index}-"))
            result = await run_rate_level(
                self.url, PickedRequests(bodies, mine), offsets[mine], rate=rate,
                warmup=int(np.searchsorted(mine, warmup)), seed=share.inner_seed(seed),
                options=options, progress=self.progress.update, remote=self.remote)
            for r in result.records:
                r.index = int(mine[r.index])
        self.last_row = self._save(0, repeat, result, rate)
        await self._after(label)
        return result

    async def run_trace(self, repeat: int) -> LevelResult:
        """--trace: the trace's requests at its times (x speed), through the open-loop
        scheduler; the level's rate is the trace's mean rate."""
        plan = self.plan
        assert plan.trace is not None
        trace = plan.trace
        spec = plan.workload
        kw = {} if trace.id_max is None else {"id_max": trace.id_max}
        bodies = TraceRequestSet(trace.requests, self.model, block_size=trace.block_size,
                                 seed=spec.seed, endpoint=spec.endpoint, stream=spec.stream,
                                 include_usage=spec.include_usage, **kw)
        rate = trace.rate
        options = plan.client.model_copy(update=dict(
            duration_s=None, request_id_prefix=f"trace-r{repeat}-"))
        label = f"trace {trace.path}" + (f" (repeat {repeat + 1}/{plan.repeat})"
                                         if plan.repeat > 1 else "")
        self.progress.start(label)
        if self.started_ns is None:
            self.started_ns = time.perf_counter_ns()
        result = await run_rate_level(self.url, bodies, offsets_ns(trace.requests, trace.speed),
                                      rate=rate, max_concurrency=plan.max_concurrency,
                                      seed=[spec.seed, repeat], options=options,
                                      progress=self.progress.update)
        self.last_row = self._save(0, repeat, result, rate)
        await self._after(label)
        return result

    def _save(self, concurrency: int, repeat: int, result: LevelResult,
              rate: float | None = None) -> pd.Series:
        for r in result.records:
            r.run_id = self.run_id
            r.repeat = repeat
        self.records.extend(result.records)
        level_rows = rows(result.records)
        self.writer.append(level_rows)
        self.clients[level_key(concurrency, repeat, rate)] = client_health(
            result.procs, requests_frame(level_rows))
        rundir.write_json(self.run_dir / rundir.CLIENT_JSON, self.clients)
        requests = requests_frame(rows(self.records))
        procs = pd.DataFrame(self.procs_samples()) if self.procs_samples else None
        levels = summarize_run(requests, procs=procs if procs is not None and len(procs) else None,
                               clients=self.clients,
                               slos=self.plan.slos if self.plan.slos.given() else None)
        rundir.write_levels(self.run_dir, levels)
        mask = (levels["concurrency"] == concurrency) & (levels["repeat"] == repeat)
        if rate is not None:
            mask &= levels["rate"] == rate
        row = levels[mask].iloc[0]
        self.progress.done(level_line(row, self.progress.label))
        if self.on_level:
            self.on_level(concurrency, repeat, result)
        return row

    async def run_auto(self) -> None:
        """--rate auto: the closed-loop level, then rates chosen by `rate_search.next_rate`."""
        closed = await self.run_one(AUTO_CONCURRENCY, 0)
        ok = [r for r in closed.records if r.ok and not r.warmup]
        if not ok:
            raise LevelFailed(f"c={AUTO_CONCURRENCY}", closed.records)
        assert self.last_row is not None  # run_one saved the closed-loop level
        start = float(self.last_row["req_s"])
        tried: list[tuple[float, bool]] = []
        while (rate := next_rate(start, tried, self.plan.max_levels)) is not None:
            await self.run_rate(rate, 0)
            tried.append((rate, self._passed()))

    def _passed(self) -> bool:
        """Whether the last level passes the search: with SLOs, its share of requests meeting
        every SLO reaches --slo-share; without, its rate was sustained."""
        row = self.last_row
        assert row is not None
        if self.plan.slos.given():
            share = row.get("slo_share")
            return share is not None and not pd.isna(share) and share >= self.plan.slo_share
        return bool(row["sustained"] >= 1)

    async def run_conc_auto(self) -> None:
        """--conc auto: concurrencies chosen by `rate_search.next_concurrency`, each passing
        when --slo-share of its requests met every SLO."""
        tried: list[tuple[float, bool]] = []
        while (c := next_concurrency(tried, self.plan.max_levels)) is not None:
            await self.run_one(c, 0)
            tried.append((c, self._passed()))

    async def run(self) -> None:
        if self.plan.rate_auto:
            await self.run_auto()
            return
        if self.plan.conc_auto:
            await self.run_conc_auto()
            return
        if self.plan.trace is not None:
            for repeat in range(self.plan.repeat):
                result = await self.run_trace(repeat)
                failed = [r for r in result.records if not r.ok and not r.cancelled]
                if failed and len(failed) == len(result.records):
                    raise LevelFailed("trace", failed)
            return
        for rate, repeat in self.plan.rate_levels():
            result = await self.run_rate(rate, repeat)
            failed = [r for r in result.records if not r.ok and not r.cancelled]
            if failed and len(failed) == len(result.records):
                raise LevelFailed(rate_label(rate), failed)
        for concurrency, repeat in self.plan.levels():
            result = await self.run_one(concurrency, repeat)
            failed = [r for r in result.records if not r.ok and not r.cancelled]
            if failed and len(failed) == len(result.records):
                raise LevelFailed(f"c={concurrency}", failed)


class LevelFailed(RuntimeError):
    """Every request of a level failed: the sweep stops (the next levels would fail the same
    way); the level is kept, with its errors, in the run directory."""

    def __init__(self, level: str, failed: list[RequestRecord]) -> None:
        self.level = level
        super().__init__(f"{level}: {failed_sentence(rows(failed))}; the sweep stopped "
                         "there (the next levels would fail the same way)")


def level_line(row: pd.Series, label: str) -> str:
    def f(v: float | None, d: int = 1) -> str:
        return "-" if v is None or pd.isna(v) else f"{v:,.{d}f}"

    return (f"{label}: {int(row['requests'])} requests in {f(row['duration_s'], 2)} s, "
            f"{f(row['req_s'])} req/s, {f(row['out_tok_s'], 0)} out tok/s, "
            f"latency avg {f(row['latency_ms_avg'])} ms, TTFT avg {f(row['ttft_ms_avg'], 2)} ms, "
            f"errors {row['errors']}"
            + (f", cancelled {int(row['cancelled'])}" if row.get("cancelled") else ""))
