"""`lab fidelity`'s verdicts: each metric of each level, the lab against the target, as a gap in
percent and a word (pure: level tables in, rows out).

A level is a concurrency (closed loop) or an offered rate (open loop, and a trace replay, whose
one level's rate is the trace's): levels line up by that key, as `lab compare` lines them up."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from lab.analysis import catalogue as cat
from lab.analysis.catalogue import Column

#: The columns compared level by level (the catalogue's). TTFT's mean is there because at a
#: closed loop's wave boundary a level's TTFT is bimodal and its p50 falls on the boundary,
#: where it moves between runs of one stack far more than the mean does (docs/fidelity.md
#: "TTFT at c=32: waves, and the pass a wave misses").
COLUMNS: tuple[Column, ...] = (
    cat.TTFT.col("p50"),
    cat.TTFT.col("avg"),
    cat.TTFT.col("p99"),
    cat.ITL.col("p50"),
    cat.LATENCY.col("p50"),
    cat.REQ_S.col(),
)
#: (levels.csv column, the name shown) of each of COLUMNS: what the gaps, the suite and the
#: plots iterate over.
METRICS: tuple[tuple[str, str], ...] = tuple((c.name, c.heading) for c in COLUMNS)
WITHIN_5 = 5.0
WITHIN_10 = 10.0
#: the concurrency levels at which the disaggregation cost is stated
DISAGG_COST_LEVELS = (32, 128)


def gap_pct(target: float, lab: float) -> float:
    """(lab - target) / target in %, NaN when either is missing or the target is 0."""
    if not (math.isfinite(target) and math.isfinite(lab)) or target == 0:
        return math.nan
    return 100.0 * (lab - target) / target


def verdict(gap: float) -> str:
    if not math.isfinite(gap):
        return "n/a"
    if abs(gap) <= WITHIN_5:
        return "within 5%"
    if abs(gap) <= WITHIN_10:
        return "within 10%"
    return "off"


#: a level's key: ("c", concurrency) or ("rate", offered req/s, rounded to RATE_DIGITS)
LevelKey = tuple[str, float]
RATE_DIGITS = 6


def level_keys(levels: pd.DataFrame) -> list[LevelKey]:
    """The keys of a level table's rows: closed-loop levels first (by concurrency), then
    open-loop ones (by rate)."""
    rates = levels["rate"] if "rate" in levels else pd.Series([math.nan] * len(levels))
    keys = {_key(int(c), r) for c, r in zip(levels["concurrency"], rates, strict=True)}
    return sorted(keys)


def _key(concurrency: int, rate: Any) -> LevelKey:
    if rate is None or pd.isna(rate):
        return ("c", float(concurrency))
    return ("rate", round(float(rate), RATE_DIGITS))


def key_name(key: LevelKey, trace: bool = False) -> str:
    """'c=32', 'rate=2.5/s', or 'trace' (the one level of a trace replay)."""
    if key[0] == "c":
        return f"c={int(key[1])}"
    return "trace" if trace else f"rate={key[1]:g}/s"


@dataclass(frozen=True)
class Gap:
    concurrency: int  # 0 for an open-loop level
    metric: str
    label: str
    target: float
    lab: float
    gap_pct: float
    verdict: str
    rate: float | None = field(default=None, kw_only=True)  # an open-loop level's offered rate
    level: str = field(default="", kw_only=True)  # 'c=32', 'rate=2.5/s', 'trace'

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def level_value(levels: pd.DataFrame, conc: int | LevelKey, column: str) -> float:
    """`column` at a level (a concurrency, or a level key) of a level table; NaN when missing
    or not a number."""
    key = conc if isinstance(conc, tuple) else ("c", float(conc))
    rates = levels.get("rate")
    if key[0] == "c":
        mask = levels["concurrency"] == int(key[1])
        if rates is not None:
            mask &= rates.isna()
    elif rates is None:
        return math.nan
    else:
        mask = (rates.astype(float).round(RATE_DIGITS) == key[1])
    row = levels[mask]
    if row.empty or column not in row:
        return math.nan
    v = row[column].iloc[0]
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def key_fields(key: LevelKey, trace: bool = False) -> dict[str, Any]:
    """A Gap's level fields of `key`: its concurrency (0 when open loop), rate and name."""
    closed = key[0] == "c"
    return {"concurrency": int(key[1]) if closed else 0,
            "rate": None if closed else key[1], "level": key_name(key, trace)}


def level_gaps(target: pd.DataFrame, lab: pd.DataFrame, trace: bool = False) -> list[Gap]:
    """Every metric at every level (concurrency or offered rate) both sides measured;
    `trace`: the rate level is a trace replay's (named 'trace')."""
    out = []
    for key in sorted(set(level_keys(target)) & set(level_keys(lab))):
        where = key_fields(key, trace)
        for column, label in METRICS:
            t, x = level_value(target, key, column), level_value(lab, key, column)
            g = gap_pct(t, x)
            out.append(Gap(where["concurrency"], column, label, t, x, g, verdict(g),
                           rate=where["rate"], level=where["level"]))
    return out


def disagg_cost(agg: pd.DataFrame, disagg: pd.DataFrame,
                levels: Sequence[int] = DISAGG_COST_LEVELS) -> dict[int, float]:
    """Throughput lost by disaggregation, % of the aggregated req/s, per concurrency level
    (levels that either run lacks are left out)."""
    out = {}
    for c in levels:
        a, d = level_value(agg, c, cat.REQ_S.name), level_value(disagg, c, cat.REQ_S.name)
        if math.isfinite(a) and math.isfinite(d) and a > 0:
            out[c] = 100.0 * (1.0 - d / a)
    return out
