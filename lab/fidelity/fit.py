"""Fit the mocker's `profile` timing model (mocker/engine/timing.py) to probe results.

Pure arithmetic: probe medians in, profile knots, residuals and engine args out.

Decode: every probe gives one knot, (active KV tokens of a typical decode step, the mean gap
between streamed tokens without the passes that held another request's prefill; see
`lab.fidelity.probes.decode_step_ms`). A gap between two tokens of one stream is one engine
pass, and the path's per-token cost is pipelined, so it does not add to the gap.

Prefill and path: each concurrency-1 ``context`` probe at prompt length T gives

    rest(T) = TTFT(T) - lab_path(T) - first_decode(T)

`lab_path(T)` is the lab's own HTTP + request-plane + gRPC path at T prompt tokens (measured on
a lab stack whose engine takes a known fixed time, or given), and `first_decode(T)` is the
decode step the lab mocker charges for the first token where the engine type's
``first_token_decode`` default is on (off under both policies today). `rest(T)` is the
target's prefill plus whatever of its own path exceeds the lab's. The ``overlap`` probe at T
separates the two: its prefill gap (a pass that held one T-token prefill, seen from another
stream, minus a plain pass) is the engine's prefill alone. So prefill(T) = that gap, and
request(T) = rest(T) - prefill(T), a per-request latency that holds no engine pass (the
profile's ``request`` rows). Without an overlap gap at T, the prefill knot is rest(T): the
target's path is then charged per pass, which is right at concurrency 1 and too much once
passes batch several requests (docs/fidelity.md).

A target whose path holds the first token back (TTFT flat over short prompts while the
prefill grows) is fitted as a first-token floor instead (`choose_request_mode`): the request
knots are then the engine-side time before which no first token is emitted (``request_mode:
floor``), and the request is scheduled at once.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.fidelity.probes import ProbeResult
from mocker.engine.config import DEFAULT_FIRST_TOKEN_DECODE, DEFAULT_MAX_NUM_BATCHED_TOKENS
from mocker.engine.timing import DECODE_FLOOR_MS, PROFILE_COLUMNS, Interp1D

#: a prefix probe whose TTFT saves at least this share of the fitted prefill: the target caches
PREFIX_CACHE_SHARE = 0.5
#: the floor model must explain the context lengths this many times better than the delay
FLOOR_SSE_RATIO = 4.0
#: a floor binds at a length when it is this far above that length's prefill (+ first step)
FLOOR_MIN_MS = 5.0


@dataclass(frozen=True)
class Knot:
    kind: str  # "prefill" | "decode"
    tokens: float
    ms: float
    source: str  # the probe it came from
    raw_ms: float  # the measured figure it was derived from (TTFT or gap)
    note: str = ""


@dataclass
class Fit:
    engine_type: str
    prefill: list[Knot]
    decode: list[Knot]
    lab_path_ms: dict[int, float]
    #: the target's path beyond the lab's, per prompt length (needs the overlap probes)
    request: list[Knot] = field(default_factory=list)
    prefix_cache: bool | None = None  # None: no prefix probe
    prefix_saving_share: float | None = None
    warnings: list[str] = field(default_factory=list)
    #: how the request knots apply (mocker/engine/config.py REQUEST_MODES): ``delay`` = a
    #: latency before scheduling, ``floor`` = the engine-side time before which no first token
    #: is emitted (`choose_request_mode`)
    request_mode: str = "delay"
    #: the two models' squared errors over the context lengths (ms^2) and the fitted floor
    mode_evidence: dict[str, float] = field(default_factory=dict)

    def prefill_fn(self) -> Interp1D:
        return Interp1D([(k.tokens, k.ms) for k in self.prefill])

    def decode_fn(self) -> Interp1D:
        return Interp1D([(k.tokens, k.ms) for k in self.decode])

    def prefill_ms(self, tokens: float) -> float:
        """What the lab mocker will charge for a pass of `tokens` new prompt tokens."""
        return max(self.prefill_fn()(tokens), 0.0) if tokens > 0 else 0.0

    def request_ms(self, prompt_tokens: float) -> float:
        """The per-request latency the lab mocker will add (0 without request knots)."""
        if not self.request:
            return 0.0
        return max(Interp1D([(k.tokens, k.ms) for k in self.request])(prompt_tokens), 0.0)

    def decode_ms(self, kv_tokens: float) -> float:
        return max(self.decode_fn()(kv_tokens), DECODE_FLOOR_MS)

    def residuals(self) -> list[dict[str, Any]]:
        """Per knot: its value against the profile without it (leave-one-out: interpolated or
        extrapolated from the other knots). A large residual says the curve bends between the
        probe points more than a straight segment does: probe more lengths there."""
        out = []
        for kind, knots in (("prefill", self.prefill), ("decode", self.decode),
                            ("request", self.request)):
            for i, k in enumerate(knots):
                others = [(o.tokens, o.ms) for j, o in enumerate(knots) if j != i]
                loo = Interp1D(others)(k.tokens) if others else math.nan
                out.append({"kind": kind, "tokens": k.tokens, "ms": k.ms, "source": k.source,
                            "measured_ms": k.raw_ms, "loo_ms": loo,
                            "loo_residual_pct": (100.0 * (k.ms - loo) / loo
                                                 if others and loo else math.nan),
                            "note": k.note})
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"engine_type": self.engine_type,
                "prefill": [k.__dict__ for k in self.prefill],
                "decode": [k.__dict__ for k in self.decode],
                "request": [k.__dict__ for k in self.request],
                "lab_path_ms": {str(k): v for k, v in self.lab_path_ms.items()},
                "prefix_cache": self.prefix_cache, "request_mode": self.request_mode,
                "mode_evidence": self.mode_evidence,
                "prefix_saving_share": self.prefix_saving_share,
                "residuals": self.residuals(), "warnings": self.warnings}


def path_at(lab_path_ms: Mapping[int, float], tokens: float) -> float:
    """The lab path at `tokens` prompt tokens: interpolated between the measured lengths
    (each measured right after the target's probe of that length), floored at 0."""
    pts = [(float(k), v) for k, v in lab_path_ms.items() if math.isfinite(v)]
    if not pts:
        return 0.0
    return max(Interp1D(pts)(tokens), 0.0)


def _merge(knots: list[Knot]) -> list[Knot]:
    """Sorted by tokens; knots at the same token count are averaged (one knot per x)."""
    by_x: dict[float, list[Knot]] = {}
    for k in knots:
        by_x.setdefault(k.tokens, []).append(k)
    out = []
    for x in sorted(by_x):
        group = by_x[x]
        if len(group) == 1:
            out.append(group[0])
        else:
            out.append(Knot(group[0].kind, x, sum(g.ms for g in group) / len(group),
                            "+".join(g.source for g in group),
                            sum(g.raw_ms for g in group) / len(group), "mean of probes"))
    return out


def _monotone(knots: list[Knot]) -> list[Knot]:
    """The decode knots made non-decreasing in KV tokens (pool adjacent violators: a run of
    knots that falls is replaced by its mean). More KV never makes a step cheaper; a fall is
    probes at similar KV disagreeing (e.g. 64 streams lagging in the path vs 2 streams)."""
    blocks: list[list[Knot]] = []
    for k in knots:
        blocks.append([k])
        while len(blocks) > 1 and (sum(x.ms for x in blocks[-2]) / len(blocks[-2])
                                   > sum(x.ms for x in blocks[-1]) / len(blocks[-1])):
            last = blocks.pop()
            blocks[-1].extend(last)
    out = []
    for block in blocks:
        mean = sum(x.ms for x in block) / len(block)
        for x in block:
            out.append(x if len(block) == 1 else Knot(x.kind, x.tokens, mean, x.source,
                                                      x.raw_ms, "pooled (non-decreasing)"))
    return out


def fit_profile(results: Sequence[ProbeResult], lab_path_ms: Mapping[int, float],
                engine_type: str = "trtllm",
                budget: int = DEFAULT_MAX_NUM_BATCHED_TOKENS) -> Fit:
    """Knots of the profile from the probe results (see the module docstring).

    Raises ValueError when the probes cannot give a profile (no usable decode or prefill
    figure), naming what is missing."""
    warnings: list[str] = []
    decode: list[Knot] = []
    for r in results:
        if r.probe.kind == "prefix":
            continue
        if not math.isfinite(r.decode_step_ms) or r.decode_step_ms <= 0:
            warnings.append(f"{r.probe.name}: no token gaps measured (skipped for decode)")
            continue
        decode.append(Knot("decode", r.probe.decode_kv_tokens, max(r.decode_step_ms,
                                                                    DECODE_FLOOR_MS),
                           r.probe.name, r.decode_step_ms))
    if not decode:
        raise ValueError("no probe measured a gap between streamed tokens (is --osl of the "
                         "probes above 1, and does the target stream one token per event?)")
    decode = _monotone(_merge(decode))
    dfn = Interp1D([(k.tokens, k.ms) for k in decode])

    # a held gap no longer than a plain one is a measured 0: that prefill blocks nobody
    overlap = {r.probe.isl: max(r.prefill_gap_ms, 0.0) for r in results
               if r.probe.kind == "overlap" and math.isfinite(r.prefill_gap_ms)}
    prefill: list[Knot] = []
    request: list[Knot] = []
    lengths: list[tuple[float, float, float, float]] = []  # (T, rest, prefill, first)
    for r in results:
        if r.probe.kind != "context":
            continue
        if not math.isfinite(r.ttft_ms_p50):
            warnings.append(f"{r.probe.name}: no TTFT measured (skipped for prefill)")
            continue
        t = float(r.probe.tokens)
        first = max(dfn(t), DECODE_FLOOR_MS) if DEFAULT_FIRST_TOKEN_DECODE[engine_type] else 0.0
        path = path_at(lab_path_ms, t)
        rest = r.ttft_ms_p50 - path - first  # the target's prefill plus its own path
        if rest < 0:
            warnings.append(f"{r.probe.name}: TTFT {r.ttft_ms_p50:.2f} ms is below the lab's "
                            f"path + first decode step ({path + first:.2f} ms): prefill set to 0 "
                            "(the target is faster than the lab can be at this length)")
            rest = 0.0
        engine_ms = overlap.get(r.probe.isl)
        if engine_ms is None:
            if overlap or any(x.probe.kind == "overlap" for x in results):
                warnings.append(f"{r.probe.name}: no overlap gap at {t:g} tokens: its prefill "
                                "knot keeps the target's path")
            prefill.append(Knot("prefill", t, rest, r.probe.name, r.ttft_ms_p50,
                                f"TTFT {r.ttft_ms_p50:.2f} - lab path {path:.2f} - first "
                                f"decode step {first:.2f}"))
            continue
        ms = min(engine_ms, rest)
        lengths.append((t, rest, ms, first))
        prefill.append(Knot("prefill", t, ms, f"overlap-isl{r.probe.isl}", engine_ms,
                            "a pass seen from another stream"))
        request.append(Knot("request", t, rest - ms, r.probe.name, r.ttft_ms_p50,
                            f"TTFT {r.ttft_ms_p50:.2f} - lab path {path:.2f} - first decode "
                            f"step {first:.2f} - prefill {ms:.2f}"))
    if not prefill:
        raise ValueError("no concurrency-1 context probe measured a TTFT: cannot fit prefill")
    top = max(k.tokens for k in prefill)
    if top < budget:
        warnings.append(f"the prefill knots end at {top:g} tokens, below a pass's token budget "
                        f"({budget}, max_num_batched_tokens): fuller "
                        "passes are extrapolated linearly from the last two knots, which "
                        "understates a prefill that grows faster (add that length to "
                        "--context-isl)")
    fit = Fit(engine_type, _merge(prefill), decode, dict(lab_path_ms), _merge(request),
              warnings=warnings)
    mode, evidence = choose_request_mode(lengths)
    fit.mode_evidence = evidence
    if mode == "floor":
        fit.request_mode = "floor"
        # the lab mocker releases a held first token at the floor itself (as a delayed ACK's
        # timer does), so the knot is the engine-side time to the first token
        fit.request = _merge([Knot("request", t, rest + first, "floor", rest + first,
                                   f"first token no earlier: rest {rest:.2f} + first decode "
                                   f"step {first:.2f} (prefill {pf:.2f})")
                              for t, rest, pf, first in lengths])
    _prefix_effect(fit, results)
    return fit


def _floor_sse(lengths: Sequence[tuple[float, float, float, float]], floor: float) -> float:
    return sum((rest + first - max(floor, pf + first)) ** 2 for _, rest, pf, first in lengths)


def choose_request_mode(lengths: Sequence[tuple[float, float, float, float]]
                        ) -> tuple[str, dict[str, float]]:
    """``floor`` or ``delay`` for the request knots, from (T, rest(T), prefill(T), first(T))
    of each context length, and the evidence.

    Two one-parameter models of the engine-side time to the first token, a(T) = rest(T) +
    first(T), against b(T) = prefill(T) + first(T): a path latency in front of the engine,
    a = R + b (the request waits R before it is scheduled), or a first-token floor, a =
    max(F, b) (the path holds the first token back while the engine works: Dynamo 1.6.1,
    docs/fidelity.md). A target's TTFT that stays flat while its prefill grows is the floor.
    The floor is chosen when it explains the lengths at least FLOOR_SSE_RATIO times better and
    binds (F above b by FLOOR_MIN_MS) at two lengths or more; else the delay, which is also
    what a target without extra path time (R ~ 0, both models alike) gets."""
    evidence: dict[str, float] = {}
    if len(lengths) < 3:
        return "delay", evidence
    diffs = [rest - pf for _, rest, pf, _ in lengths]
    mean = sum(diffs) / len(diffs)
    sse_delay = sum((d - mean) ** 2 for d in diffs)
    tops = [rest + first for _, rest, _, first in lengths]
    lo, hi = min(tops), max(tops)
    grid = [lo + (hi - lo) * i / 400 for i in range(401)]
    floor = min(grid, key=lambda f: _floor_sse(lengths, f))
    sse_floor = _floor_sse(lengths, floor)
    binds = sum(1 for _, _, pf, first in lengths if floor - (pf + first) >= FLOOR_MIN_MS)
    evidence = {"sse_delay_ms2": sse_delay, "sse_floor_ms2": sse_floor, "floor_ms": floor,
                "delay_ms": mean, "floor_binds_at": float(binds)}
    if binds >= 2 and sse_floor * FLOOR_SSE_RATIO < sse_delay:
        return "floor", evidence
    return "delay", evidence


def _prefix_effect(fit: Fit, results: Sequence[ProbeResult]) -> None:
    """The repeated-prompt probe: the share of the prefill its TTFT saves."""
    for r in results:
        if r.probe.kind != "prefix" or not math.isfinite(r.ttft_ms_p50):
            continue
        t = float(r.probe.tokens)
        prefill = fit.prefill_ms(t)
        if prefill <= 0:
            fit.warnings.append(f"{r.probe.name}: fitted prefill at {t:g} tokens is 0: the "
                                "prefix-cache effect cannot be measured")
            return
        first = fit.decode_ms(t) if DEFAULT_FIRST_TOKEN_DECODE[fit.engine_type] else 0.0
        if fit.request_mode == "floor":
            # a cached prompt still waits for the floor: a saving of half the prefill shows
            # only where the floor is below what is left of the pass
            if fit.request_ms(t) >= first + prefill * (1 - PREFIX_CACHE_SHARE):
                fit.warnings.append(f"{r.probe.name}: the first-token floor at {t:g} tokens "
                                    f"({fit.request_ms(t):.2f} ms) hides the prefill "
                                    f"({prefill:.2f} ms): the prefix-cache effect cannot be "
                                    "measured (left at the lab's default)")
                return
            fresh = path_at(fit.lab_path_ms, t) + max(fit.request_ms(t), prefill + first)
        else:
            fresh = path_at(fit.lab_path_ms, t) + fit.request_ms(t) + prefill + first
        fit.prefix_saving_share = (fresh - r.ttft_ms_p50) / prefill
        fit.prefix_cache = fit.prefix_saving_share >= PREFIX_CACHE_SHARE
        return


def write_profile(fit: Fit, path: Path) -> Path:
    """The CSV the mocker's `profile` timing model reads (header kind,tokens,ms)."""
    with open(path, "w", newline="") as f:
        f.write("# lab calibrate: prefill from a pass seen from another stream (or TTFT at "
                "concurrency 1 minus the lab's path and first decode step), decode from the "
                "mean token gap without prefill passes, request = the rest of TTFT\n")
        w = csv.writer(f)
        w.writerow(PROFILE_COLUMNS)
        for k in fit.prefill + fit.decode + fit.request:
            w.writerow([k.kind, f"{k.tokens:g}", f"{k.ms:.6g}"])
    return path


def engine_args(fit: Fit, profile_path: Path) -> dict[str, Any]:
    """Engine args (`--engine-args`) that run the lab mocker on the fitted profile."""
    timing: dict[str, Any] = {"type": "profile", "path": str(profile_path.resolve())}
    if fit.request_mode != "delay":
        timing["request_mode"] = fit.request_mode
    args: dict[str, Any] = {"engine_type": fit.engine_type, "timing": timing}
    if fit.prefix_cache is not None:
        args["enable_prefix_caching"] = fit.prefix_cache
    return args
