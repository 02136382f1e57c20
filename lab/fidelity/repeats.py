"""`lab fidelity --repeat K`: each metric over K repeats of target and lab, in turn.

One sweep of a closed loop can land in one of two modes at a level (a wave admitted in one
engine pass or split over two, docs/fidelity.md "TTFT at c=32: waves, and the pass a wave
misses"), so one sweep's gap can be a draw from either. Over repeats the gap is the ratio of
the two sides' medians, with a 95% interval from a paired bootstrap (repeats resampled whole,
so a repeat's drift, shared by both sides, stays paired); the median of the per-repeat gaps is
shown beside it, and the target's own spread over the repeats: a gap smaller than the
target's run-to-run spread is not one a single sweep resolves (at ISL 136 c=128 a closed
loop's TTFT p50 moved by 18.8% of its median between repeats of Dynamo's own stack,
docs/measurements.md "Fidelity against Dynamo 1.6.1's mocker"). The verdict words are
those of one sweep (`gaps.verdict`), on the ratio of the medians. Pure: level tables in, rows
out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from lab.fidelity.gaps import (
    METRICS,
    Gap,
    gap_pct,
    key_fields,
    level_keys,
    level_value,
    verdict,
)

#: bootstrap resamples of the repeats, and the seed that makes an interval reproducible
BOOTSTRAP_RESAMPLES = 4000
BOOTSTRAP_SEED = 0
INTERVAL = 0.95


@dataclass(frozen=True)
class RepeatGap(Gap):
    """A metric at a level over the repeats: `target` and `lab` are the medians, `gap_pct`
    their gap, `low_pct`..`high_pct` its interval, `repeat_gap_pct` the median of the
    per-repeat gaps, `target_spread_pct` the target's (max - min) over the repeats in % of its
    median."""

    low_pct: float
    high_pct: float
    repeat_gap_pct: float
    target_spread_pct: float
    target_repeats: list[float]
    lab_repeats: list[float]


def median_levels(repeats: list[pd.DataFrame]) -> pd.DataFrame:
    """One row per level (concurrency, and rate when open loop): each compared metric's median
    over the repeats that have it."""
    columns = [c for c, _ in METRICS]
    rated = any("rate" in r for r in repeats)
    keys = ["concurrency", "rate"] if rated else ["concurrency"]
    frames = [r.assign(rate=r.get("rate", math.nan)) if rated else r
              for r in repeats]
    frames = [f[[*keys, *[c for c in columns if c in f]]] for f in frames]
    return pd.concat(frames).groupby(keys, as_index=False, dropna=False).median()


def _finite_pairs(target: list[float], lab: list[float]) -> list[tuple[float, float]]:
    """The repeats that have the value on both sides."""
    return [(t, x) for t, x in zip(target, lab, strict=True)
            if math.isfinite(t) and math.isfinite(x)]


def interval(target: list[float], lab: list[float]) -> tuple[float, float]:
    """The INTERVAL bootstrap interval of gap_pct(median(target), median(lab)), in %,
    resampling the paired repeats; NaN when fewer than two repeats have both values."""
    pairs = np.array(_finite_pairs(target, lab))
    if len(pairs) < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    picks = rng.integers(0, len(pairs), size=(BOOTSTRAP_RESAMPLES, len(pairs)))
    t_med = np.median(pairs[picks, 0], axis=1)
    x_med = np.median(pairs[picks, 1], axis=1)
    valid = t_med != 0
    gaps = 100.0 * (x_med[valid] - t_med[valid]) / t_med[valid]
    if not len(gaps):
        return math.nan, math.nan
    tail = 100.0 * (1.0 - INTERVAL) / 2.0
    low, high = np.percentile(gaps, [tail, 100.0 - tail])
    return float(low), float(high)


def repeat_gaps(target: list[pd.DataFrame], lab: list[pd.DataFrame],
                trace: bool = False) -> list[RepeatGap]:
    """Every metric at every level (concurrency or offered rate) both sides measured, over
    paired repeats (repeat k of `target` with repeat k of `lab`; a repeat that lacks the value
    on either side is left out of that metric's figures). `trace`: the rate level is a trace
    replay's."""
    if len(target) != len(lab):
        raise ValueError(f"{len(target)} target repeats against {len(lab)} lab repeats")
    keys = sorted(set().union(*(set(level_keys(r)) for r in target))
                  & set().union(*(set(level_keys(r)) for r in lab)))
    out = []
    for key in keys:
        where = key_fields(key, trace)
        for column, label in METRICS:
            t = [level_value(levels, key, column) for levels in target]
            x = [level_value(levels, key, column) for levels in lab]
            paired = _finite_pairs(t, x)
            t_med = _nanmedian([a for a, _ in paired])
            x_med = _nanmedian([b for _, b in paired])
            g = gap_pct(t_med, x_med)
            low, high = interval(t, x)
            per_repeat = [gap_pct(a, b) for a, b in zip(t, x, strict=True)]
            out.append(RepeatGap(where["concurrency"], column, label, t_med, x_med, g,
                                 verdict(g), low, high, _nanmedian(per_repeat), spread_pct(t),
                                 t, x, rate=where["rate"], level=where["level"]))
    return out


def spread_pct(values: list[float]) -> float:
    """(max - min) / median of the finite values, in %; NaN with fewer than two or a median
    of 0."""
    finite = [v for v in values if math.isfinite(v)]
    median = _nanmedian(finite)
    if len(finite) < 2 or not median:
        return math.nan
    return 100.0 * (max(finite) - min(finite)) / abs(median)


def _nanmedian(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.median(finite)) if finite else math.nan
