"""Stall-cluster statistics of TTFT samples, for the Nagle probe (docs/nagle.md).

This module is the statistics only: the kernel facts are `lab.nagle.kernel_facts`, the
verdict (as data) `lab.nagle.verdict`, its words `lab.nagle.words`.

Statistics for one set of TTFT samples (one arm, one concurrency level):

- ``baseline``: the fastest decile (p10) of the samples. When nearly every request stalls, the
  p10 itself lies inside the cluster, so two things can lower it: when the sorted samples have a
  gap of at least ``threshold_ms``, the p10 of the samples below the widest such gap (e.g. the
  first request of each fresh connection, fast before the connection turned idle-slow); and a
  reference passed in by the caller (a probe passes, per concurrency level, the fastest decile
  of the fastest arm at that level: same load, one setting apart). The lowest is the baseline.
- the **stall cluster**: samples at least ``threshold_ms`` (default 30 ms) above the baseline;
  its share and its median.
- **bimodality**, gap based: both the fast part (below the cluster floor) and the cluster hold at
  least 5% of the samples, and the modes are clearly apart: the cluster's own p10 lies at least
  ``threshold_ms / 2`` above the fast part's p90 (a few in-between samples on a busy machine do
  not hide two modes; a spread-out unimodal distribution has no such gap). Sarle's bimodality
  coefficient b = (skew^2 + 1) / (excess kurtosis + 3(n-1)^2 / ((n-2)(n-3))) is reported beside it
  (b > 5/9 hints at bimodality) but does not decide: it reads a single far outlier as a second
  mode, which the share condition rules out.
- fewer than 30 samples: "too few samples", no verdict.

The shape of one distribution is one of ``too-few``, ``unimodal`` (cluster < 5%), ``bimodal``,
``stalled`` (>= 95% in the cluster: only possible against a reference baseline), ``spread``
(a cluster of 5-95% without a clear gap).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

DEFAULT_THRESHOLD_MS = 30.0
MIN_SAMPLES = 30
MODE_MIN_SHARE = 0.05  # each mode of a bimodal distribution holds at least this share
STALLED_SHARE = 0.95  # a cluster at least this big: the whole distribution stalls
REPRODUCED_SHARE = 0.5  # the suspect arm's cluster holds more than this: reproduced
ABSENT_SHARE = 0.05  # a cluster below this share counts as absent
VANISHED_SHARE = 0.05
SARLE_BIMODAL = 5.0 / 9.0


@dataclass(frozen=True)
class StallStats:
    """Stall-cluster statistics of one TTFT sample set (all times in ms)."""

    n: int
    threshold_ms: float
    shape: str  # too-few | unimodal | bimodal | stalled | spread
    min_ms: float | None = None
    p10_ms: float | None = None
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    mean_ms: float | None = None
    baseline_ms: float | None = None
    cluster_floor_ms: float | None = None
    cluster_n: int = 0
    cluster_share: float = 0.0
    cluster_median_ms: float | None = None
    cluster_excess_ms: float | None = None  # cluster median - baseline
    fast_median_ms: float | None = None
    mode_gap_ms: float | None = None  # cluster p10 - fast part p90
    sarle_b: float | None = None

    @property
    def too_few(self) -> bool:
        return self.shape == "too-few"

    @property
    def bimodal(self) -> bool:
        return self.shape == "bimodal"

    @property
    def has_cluster(self) -> bool:
        return not self.too_few and self.cluster_share >= ABSENT_SHARE

    def to_dict(self) -> dict:
        return {**asdict(self), "bimodal": self.bimodal, "too_few": self.too_few}


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q, method="linear"))


def sarle_bimodality(values: Sequence[float] | np.ndarray) -> float | None:
    """Sarle's bimodality coefficient with the sample skewness and excess kurtosis (n >= 4)."""
    x = np.asarray(values, dtype=float)
    n = x.size
    if n < 4:
        return None
    m = x.mean()
    d = x - m
    m2 = float(np.mean(d**2))
    if m2 <= 0:
        return None
    m3 = float(np.mean(d**3))
    m4 = float(np.mean(d**4))
    g1 = m3 / m2**1.5
    g2 = m4 / m2**2 - 3.0
    # bias-corrected sample skewness and excess kurtosis (as SAS / Sarle use)
    skew = g1 * math.sqrt(n * (n - 1)) / (n - 2)
    kurt = ((n + 1) * g2 + 6) * (n - 1) / ((n - 2) * (n - 3))
    return (skew**2 + 1) / (kurt + 3 * (n - 1) ** 2 / ((n - 2) * (n - 3)))


def _fast_baseline(x: np.ndarray, threshold_ms: float) -> float:
    """The p10 of sorted `x`, or, when a gap of at least `threshold_ms` splits it, the p10 of
    the samples below the widest gap (lower of the two)."""
    base = _pct(x, 10)
    if x.size >= 2:
        gaps = np.diff(x)
        i = int(np.argmax(gaps))
        if gaps[i] >= threshold_ms:
            base = min(base, _pct(x[: i + 1], 10))
    return base


def fast_baseline(
    ttft_ms: Sequence[float], threshold_ms: float = DEFAULT_THRESHOLD_MS
) -> float | None:
    """The fastest decile as stall_stats measures it (None without samples)."""
    x = np.asarray([v for v in ttft_ms if v is not None], dtype=float)
    x = np.sort(x[~np.isnan(x)])
    return _fast_baseline(x, threshold_ms) if x.size else None


def stall_stats(
    ttft_ms: Sequence[float],
    *,
    threshold_ms: float = DEFAULT_THRESHOLD_MS,
    baseline_ms: float | None = None,
    min_samples: int = MIN_SAMPLES,
) -> StallStats:
    """Stall-cluster statistics of `ttft_ms` (NaN and None values are dropped).

    `baseline_ms`: a reference fastest decile (e.g. the control arm's); the lower of it and this
    set's own p10 is used.
    """
    x = np.asarray([v for v in ttft_ms if v is not None], dtype=float)
    x = np.sort(x[~np.isnan(x)])
    n = int(x.size)
    if n == 0:
        return StallStats(n=0, threshold_ms=threshold_ms, shape="too-few")
    p10 = _pct(x, 10)
    base = _fast_baseline(x, threshold_ms)
    if baseline_ms is not None:
        base = min(base, baseline_ms)
    floor = base + threshold_ms
    cluster = x[x >= floor]
    fast = x[x < floor]
    share = cluster.size / n
    cluster_median = float(np.median(cluster)) if cluster.size else None
    gap = None
    if cluster.size and fast.size:
        gap = _pct(cluster, 10) - _pct(fast, 90)
    common: dict[str, Any] = dict(
        n=n,
        threshold_ms=threshold_ms,
        min_ms=float(x[0]),
        p10_ms=p10,
        p50_ms=_pct(x, 50),
        p90_ms=_pct(x, 90),
        p99_ms=_pct(x, 99),
        max_ms=float(x[-1]),
        mean_ms=float(x.mean()),
        baseline_ms=base,
        cluster_floor_ms=floor,
        cluster_n=int(cluster.size),
        cluster_share=share,
        cluster_median_ms=cluster_median,
        cluster_excess_ms=None if cluster_median is None else cluster_median - base,
        fast_median_ms=float(np.median(fast)) if fast.size else None,
        mode_gap_ms=gap,
        sarle_b=sarle_bimodality(x),
    )
    if n < min_samples:
        shape = "too-few"
    elif share < MODE_MIN_SHARE:
        shape = "unimodal"
    elif share >= STALLED_SHARE:
        shape = "stalled"
    elif share <= 1 - MODE_MIN_SHARE and gap is not None and gap >= threshold_ms / 2:
        shape = "bimodal"
    else:
        shape = "spread"
    return StallStats(shape=shape, **common)


# --- arms ----------------------------------------------------------------------------------------


@dataclass
class ArmResult:
    """One arm's stats per concurrency level; `label` says in words what the arm changes."""

    arm: str
    label: str
    levels: dict[int, StallStats] = field(default_factory=dict)

    def at(self, concurrency: int) -> StallStats | None:
        return self.levels.get(concurrency)

    def to_dict(self) -> dict:
        return {
            "arm": self.arm,
            "label": self.label,
            "levels": {str(c): s.to_dict() for c, s in sorted(self.levels.items())},
        }


def arm_results(
    samples: Mapping[str, Mapping[int, Sequence[float]]],
    labels: Mapping[str, str] | None = None,
    *,
    threshold_ms: float = DEFAULT_THRESHOLD_MS,
    independent: Sequence[str] = (),
) -> dict[str, ArmResult]:
    """Stats for every arm and level; each level against the fastest arm at that level.

    At each concurrency level the baseline is the lowest fastest decile among the arms at that
    level: an arm that stalls on nearly every request would otherwise hide its cluster in its
    own p10, and arms at the same concurrency share the same queueing, so a slower fastest
    decile there is not counted as a stall. Arms named in `independent` (e.g. non-streaming,
    whose "TTFT" is the full response time) are measured against themselves only and do not
    set the others' baseline.
    """
    labels = labels or {}
    refs: dict[int, float] = {}
    for arm, levels in samples.items():
        if arm in independent:
            continue
        for conc, vals in levels.items():
            b = fast_baseline(vals, threshold_ms)
            if b is not None:
                refs[conc] = b if conc not in refs else min(refs[conc], b)
    out: dict[str, ArmResult] = {}
    for arm, levels in samples.items():
        res = ArmResult(arm=arm, label=labels.get(arm, arm))
        for conc, vals in sorted(levels.items()):
            ref = None if arm in independent else refs.get(conc)
            res.levels[conc] = stall_stats(vals, threshold_ms=threshold_ms, baseline_ms=ref)
        out[arm] = res
    return out
