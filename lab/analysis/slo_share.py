"""The share of a level's requests that met every SLO, how sure that share is, and the SLO
edge of a search (docs/open-loop.md "Finding the SLO edge").

A request is good when it succeeded and met every given SLO (TTFT, latency, ITL, each from the
request's send); a failed request is not good. The share is good / measured requests, and its
95% Wilson score interval says how much of it the request count can vouch for: 1000 requests
all good still only bound the share above 99.6%.

Why the default target share is 99% (`DEFAULT_SLO_SHARE`), not 100% or 95%: a p99 objective is
how users state an SLO ("p99 TTFT under 500 ms"), and a share of 99% is exactly that objective
(the p99 is within the SLO if and only if at least 99% of requests are); 100% would let one
slow outlier (a GC pause, a scheduling hiccup on a shared machine) end the search at any load,
and 95% would call a level good while one user in twenty misses the objective.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lab.analysis import catalogue as cat

if TYPE_CHECKING:  # `lab sweep --help` reads DEFAULT_SLO_SHARE: no pandas for that
    import pandas as pd

#: The share of requests that must meet every SLO for a level to pass (the module docstring
#: says why 99%).
DEFAULT_SLO_SHARE = 0.99
#: The normal quantile of a two-sided 95% interval.
Z_95 = 1.959963984540054


@dataclass(frozen=True)
class SLOs:
    """Service-level objectives for goodput (None = not constrained)."""

    ttft_ms: float | None = None
    latency_ms: float | None = None
    itl_ms: float | None = None

    def given(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.latency_ms, self.itl_ms))

    def words(self) -> str:
        """'TTFT <= 500 ms, latency <= 2000 ms'."""
        parts = [(n, v) for n, v in (("TTFT", self.ttft_ms), ("latency", self.latency_ms),
                                     ("ITL", self.itl_ms)) if v is not None]
        return ", ".join(f"{n} <= {v:g} ms" for n, v in parts)


def good_rows(ok_rows: pd.DataFrame, slos: SLOs) -> pd.DataFrame:
    """The successful requests that met every given SLO."""
    good = ok_rows
    if slos.ttft_ms is not None:
        good = good[good["ttft_ms"] <= slos.ttft_ms]
    if slos.latency_ms is not None:
        good = good[good["latency_ms"] <= slos.latency_ms]
    if slos.itl_ms is not None:
        good = good[good["itl_ms"].fillna(0) <= slos.itl_ms]
    return good


def wilson(k: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a share k/n: unlike the normal one it stays within [0, 1]
    and is not zero-width when every request (or none) was good."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    denom = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, mid - half), min(1.0, mid + half)


def slo_figures(measured_rows: pd.DataFrame, ok_rows: pd.DataFrame, slos: SLOs,
                duration_s: float) -> dict[str, Any]:
    """A level's goodput (good requests / measured duration), good count, share and its 95%
    interval (levels.csv columns)."""
    good = len(good_rows(ok_rows, slos))
    n = len(measured_rows)
    lo, hi = wilson(good, n)
    return {cat.GOODPUT.name: good / duration_s if duration_s > 0 else None,
            cat.SLO_GOOD.name: good, cat.SLO_SHARE.name: good / n if n else None,
            cat.SLO_SHARE_LO.name: lo if n else None, cat.SLO_SHARE_HI.name: hi if n else None}


@dataclass(frozen=True)
class SloLevel:
    """One level of a search: its load (rate or concurrency), requests, good share."""

    load: float
    requests: int
    share: float
    lo: float
    hi: float


@dataclass(frozen=True)
class SloEdge:
    """The outcome of an SLO search: the highest passing level and the first failing one above
    it (either may be missing), the target share and how many levels were run."""

    axis: str  # "rate" or "concurrency"
    target: float
    slos: SLOs
    passed: SloLevel | None
    failed: SloLevel | None
    levels: int
    max_levels: int

    def _load(self, level: SloLevel) -> str:
        return f"{level.load:g}/s" if self.axis == "rate" else f"c={level.load:g}"

    def _level(self, level: SloLevel) -> str:
        return (f"{100 * level.share:.1f}% of {level.requests} requests good, 95% interval "
                f"{100 * level.lo:.1f}-{100 * level.hi:.1f}%")

    def sentence(self) -> str:
        """What the search found and how sure it is, in one sentence."""
        what = (f"SLO edge ({self.slos.words()}; at least {100 * self.target:g}% of requests "
                f"good, {self.levels} {self.axis} levels of at most {self.max_levels})")
        p, f = self.passed, self.failed
        if p is None:
            low = self._load(f) if f is not None else "the lowest level"
            return f"{what}: no level passed, not even {low}" + (
                f" ({self._level(f)})" if f is not None else "")
        text = f"{what}: {self._load(p)} is the highest that passed ({self._level(p)})"
        if p.lo < self.target:
            text += (f", though with {p.requests} requests the interval reaches below "
                     f"{100 * self.target:g}%")
        if f is None:
            return text + "; no higher level failed, so the edge lies above it"
        gap = (f.load - p.load) / p.load
        return (text + f"; {self._load(f)} did not ({self._level(f)}), so the edge lies within "
                f"{100 * gap:.0f}% above {self._load(p)}")


def slo_edge(levels: pd.DataFrame, axis: str, target: float, slos: SLOs,
             max_levels: int) -> SloEdge | None:
    """The edge of a search's levels (levels.csv rows with `slo_share`): on `axis` ("rate":
    the open-loop levels, "concurrency": the closed-loop ones), the highest level whose share
    reached `target` below the lowest one above it that did not."""
    if "slo_share" not in levels or levels.empty:
        return None
    if axis == "rate":
        rows = levels[levels["rate"].notna()] if "rate" in levels else levels.iloc[:0]
    else:
        rows = levels[levels["rate"].isna()] if "rate" in levels else levels
    rows = rows.dropna(subset=["slo_share"])
    found = [SloLevel(float(r[axis]), int(r["requests"]), float(r["slo_share"]),
                      float(r["slo_share_lo"]), float(r["slo_share_hi"]))
             for _, r in rows.iterrows()]
    passed = [lv for lv in found if lv.share >= target]
    best = max(passed, key=lambda lv: lv.load, default=None)
    above = [lv for lv in found if lv.share < target and (best is None or lv.load > best.load)]
    first_fail = min(above, key=lambda lv: lv.load, default=None)
    return SloEdge(axis, target, slos, best, first_fail, len(found), max_levels)
