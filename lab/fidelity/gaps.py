"""`lab fidelity`'s verdicts: each metric of each level, the lab against the target, as a gap in
percent and a word (pure: level tables in, rows out)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

#: (levels.csv column, the name shown): the metrics compared level by level. TTFT's mean is
#: there because at a closed loop's wave boundary a level's TTFT is bimodal and its p50 falls
#: on the boundary, where it moved 20-24% between runs of one stack, the mean 8-9%
#: (docs/fidelity.md "Measured gaps", the Intel Xeon run).
METRICS: tuple[tuple[str, str], ...] = (
    ("ttft_ms_p50", "TTFT p50 (ms)"),
    ("ttft_ms_avg", "TTFT mean (ms)"),
    ("ttft_ms_p99", "TTFT p99 (ms)"),
    ("itl_ms_p50", "ITL p50 (ms)"),
    ("latency_ms_p50", "latency p50 (ms)"),
    ("req_s", "req/s"),
)
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


@dataclass(frozen=True)
class Gap:
    concurrency: int
    metric: str
    label: str
    target: float
    lab: float
    gap_pct: float
    verdict: str

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def level_value(levels: pd.DataFrame, conc: int, column: str) -> float:
    """`column` at concurrency `conc` of a level table; NaN when missing or not a number."""
    row = levels[levels["concurrency"] == conc]
    if row.empty or column not in row:
        return math.nan
    v = row[column].iloc[0]
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def level_gaps(target: pd.DataFrame, lab: pd.DataFrame) -> list[Gap]:
    """Every metric at every concurrency both sides measured."""
    levels = sorted(set(target["concurrency"]) & set(lab["concurrency"]))
    out = []
    for c in levels:
        for column, label in METRICS:
            t, x = level_value(target, int(c), column), level_value(lab, int(c), column)
            g = gap_pct(t, x)
            out.append(Gap(int(c), column, label, t, x, g, verdict(g)))
    return out


def disagg_cost(agg: pd.DataFrame, disagg: pd.DataFrame,
                levels: Sequence[int] = DISAGG_COST_LEVELS) -> dict[int, float]:
    """Throughput lost by disaggregation, % of the aggregated req/s, per concurrency level
    (levels that either run lacks are left out)."""
    out = {}
    for c in levels:
        a, d = level_value(agg, c, "req_s"), level_value(disagg, c, "req_s")
        if math.isfinite(a) and math.isfinite(d) and a > 0:
            out[c] = 100.0 * (1.0 - d / a)
    return out
