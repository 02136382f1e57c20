"""Replay the calibration's batch probes on a fitted timing model, offline, and pick the model
that predicts them best (`lab calibrate --timing auto`).

The fits explain each probe figure pass by pass (a decode step, a prefill, a TTFT at one
stream), but whether a model predicts requests that share passes only shows when they do: a
closed loop of c streams puts several prompts into one pass, and Dynamo 1.6.1's mocker prices
such a pass's prefill quadratically in all of its prompts together, where the `linear` model
prices attention per prompt (docs/references.md). So each batch probe (a closed loop at
concurrency c) is run again here on the mocker's own `Scheduler` on a simulated clock, with
each fitted timing, and its TTFT p50 and latency p50 compared with the target's.

What the replay leaves out, as the lab stack would add it: the lab's own path (a constant per
prompt length, the calibration's `lab path`) on each TTFT and latency. What it leaves out
because the lab stack leaves it out too: the client's own time. Each prompt is its own tokens,
so no prefix is reused (the probes' prompts are random text).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lab.fidelity.fit import path_at
from lab.fidelity.gaps import gap_pct
from lab.fidelity.probes import ProbeResult
from mocker.engine.config import EngineArgs
from mocker.engine.scheduler import EngineRequest, Scheduler
from mocker.engine.sim import timed_signals

#: a replay that has not finished after this many passes is stopped (a model too slow to be
#: a fit: the probes themselves finished in minutes)
MAX_PASSES = 2_000_000
#: the figures of a probe that the replay is scored on (ProbeResult attribute names)
SCORED = ("ttft_ms_p50", "latency_ms_p50")


@dataclass(frozen=True)
class Replayed:
    """A probe's closed loop replayed on one timing model: medians over its measured
    requests, ms, with the lab path added."""

    ttft_ms_p50: float
    latency_ms_p50: float


def replay_closed_loop(args: EngineArgs, isl: int, osl: int, concurrency: int, requests: int,
                       warmup: int, path_ms: float = 0.0) -> Replayed:
    """`concurrency` streams each send a request as soon as their previous one ends, on the
    simulated clock; the first `warmup` requests sent are not measured, the next `requests`
    are. A request becomes schedulable after the timing's per-request latency
    (`TimingModel.request_ms`, as `mocker serve` does); `path_ms` is added to each TTFT and
    latency."""
    sched = Scheduler(args)
    total = warmup + requests
    sent: dict[str, float] = {}
    first: dict[str, float] = {}
    ttfts: list[float] = []
    latencies: list[float] = []
    issued = 0

    def send(at: float) -> None:
        nonlocal issued
        key = f"r{issued}"
        # distinct first tokens per request: no two prompts share a prefix block
        base = 1 + issued * (isl + 1)
        before, after = sched.timing.request_parts_ms(isl)
        sched.add(EngineRequest(key, list(range(base, base + isl)), osl, lambda _p: 0,
                                ready_at_ms=at + before, first_delay_ms=after))
        sent[key] = at
        issued += 1

    def seen(at: float, key: str, completed: bool, rejected: bool) -> None:
        if rejected:
            raise RuntimeError(f"the replay of c={concurrency} ISL {isl} / OSL {osl} did not "
                               f"finish: the model's scheduler rejects a prompt of {isl} "
                               "tokens")
        if key not in first:
            first[key] = at
        if completed:
            if int(key[1:]) >= warmup:
                ttfts.append(first[key] - sent[key] + path_ms)
                latencies.append(at - sent[key] + path_ms)
            if issued < total:
                send(at)

    for _ in range(min(concurrency, total)):
        send(0.0)
    now = 0.0
    for _ in range(MAX_PASSES):
        if len(latencies) >= requests:
            break
        if not sched.has_work(now):
            nxt = sched.next_ready_ms(now)
            if nxt is None:
                break
            now = nxt
            continue
        res = sched.step(now)
        for at, s in timed_signals(res, now):
            seen(at, s.key, s.completed, s.rejected)
        now += res.duration_ms
    if len(latencies) < requests:
        raise RuntimeError(f"the replay of c={concurrency} ISL {isl} / OSL {osl} did not "
                           f"finish ({len(latencies)} of {requests} requests)")
    return Replayed(statistics.median(ttfts), statistics.median(latencies))


@dataclass(frozen=True)
class ProbeReplay:
    """One batch probe: the target's figures and each model's replay of them."""

    probe: str
    measured: dict[str, float]  # SCORED -> ms
    models: dict[str, dict[str, float]]  # model -> SCORED -> ms

    def error_pct(self, model: str, figure: str) -> float:
        return gap_pct(self.measured[figure], self.models[model][figure])

    def to_dict(self) -> dict[str, Any]:
        return {"probe": self.probe, "measured": self.measured, "models": self.models}


def replay_probes(results: Sequence[ProbeResult], models: Mapping[str, dict[str, Any]],
                  lab_path_ms: Mapping[int, float]) -> list[ProbeReplay]:
    """Every batch probe with a measured TTFT and latency, replayed on each model's engine
    args (the engine-args.json objects `lab calibrate` writes)."""
    engines = {name: EngineArgs.from_json(dict(a)) for name, a in models.items()}
    out = []
    for r in results:
        p = r.probe
        measured = {f: float(getattr(r, f)) for f in SCORED}
        if p.kind != "batch" or not all(math.isfinite(v) and v > 0 for v in measured.values()):
            continue
        path = path_at(lab_path_ms, p.isl)
        figures = {}
        for name, e in engines.items():
            try:
                x = replay_closed_loop(e, p.tokens, p.osl, p.concurrency, p.requests, p.warmup,
                                       path)
                figures[name] = {f: float(getattr(x, f)) for f in SCORED}
            except RuntimeError:  # did not finish: no figure, so no score from this probe
                figures[name] = {f: math.nan for f in SCORED}
        out.append(ProbeReplay(p.name, measured, figures))
    return out


def mean_abs_error_pct(replays: Sequence[ProbeReplay], model: str) -> float:
    """The mean absolute error of `model` over every replayed probe's scored figures, in %."""
    errs = [abs(r.error_pct(model, f)) for r in replays for f in SCORED]
    return sum(errs) / len(errs) if errs else math.nan  # NaN when a replay did not finish


def best_model(replays: Sequence[ProbeReplay], models: Sequence[str]) -> str:
    """The model with the lowest mean absolute error; the first of `models` on a tie or when
    nothing was replayed (the caller's default)."""
    scores = [(mean_abs_error_pct(replays, m), i) for i, m in enumerate(models)]
    finite = [(s, i) for s, i in scores if math.isfinite(s)]
    return models[min(finite)[1]] if finite else models[0]
