"""The knee rule (docs/metrics.md "The knee").

For levels sorted by concurrency, with request throughput T and average latency L, the marginal
efficiency of step i is

    e_i = ln(T_i / T_{i-1}) / ln(L_i / L_{i-1})     (latency that did not rise: e_i = +inf)

The knee is the last level before the first step whose efficiency falls below the threshold
(0.1 by default). If no step falls below it, there is no knee within the sweep.

Why logarithms: a closed loop's step multiplies concurrency by c_i / c_{i-1} = (T_i / T_{i-1}) x
(L_i / L_{i-1}) (Little's law), so in logs the step splits into what became throughput and what
became latency, and e_i compares the two on the same scale. The ratio of relative changes
(T_i / T_{i-1} - 1) / (L_i / L_{i-1} - 1) does not: from c=1 at a fast engine (latency a few ms)
a step that doubles throughput and multiplies latency 15x scored 1.07 / 14 = 0.08 and put the
knee at 1; in logs it is 0.69 / 2.7 = 0.27, and the knee lands where throughput flattens.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

DEFAULT_THRESHOLD = 0.1


@dataclass
class Step:
    from_conc: int
    to_conc: int
    throughput_gain: float  # T_i / T_{i-1} - 1
    latency_gain: float  # L_i / L_{i-1} - 1
    efficiency: float


@dataclass
class Knee:
    knee: int | None  # the knee's concurrency, or None (no knee within the sweep)
    steps: list[Step] = field(default_factory=list)
    threshold: float = DEFAULT_THRESHOLD
    breaking_step: Step | None = None  # the first step below the threshold

    @property
    def efficiencies(self) -> dict[int, float]:
        return {s.to_conc: s.efficiency for s in self.steps}

    def sentence(self) -> str:
        return knee_sentence(self)


def efficiency(t_prev: float, t: float, l_prev: float, lat: float) -> float:
    """ln(T gain) / ln(L gain) of one step (the module docstring); +inf when latency did not
    rise, -inf when throughput fell to zero, +inf from a zero (or unmeasured) level."""
    if l_prev <= 0 or t_prev <= 0:
        return math.inf
    if lat <= l_prev:
        return math.inf
    if t <= 0:
        return -math.inf
    return math.log(t / t_prev) / math.log(lat / l_prev)


def find_knee(concurrency: Sequence[int], throughput: Sequence[float],
              latency: Sequence[float], threshold: float = DEFAULT_THRESHOLD) -> Knee:
    levels = sorted(zip(concurrency, throughput, latency, strict=True))
    steps: list[Step] = []
    result = Knee(knee=None, threshold=threshold)
    for (c0, t0, l0), (c1, t1, l1) in itertools.pairwise(levels):
        step = Step(int(c0), int(c1),
                    t1 / t0 - 1 if t0 else math.inf,
                    l1 / l0 - 1 if l0 else math.inf,
                    efficiency(t0, t1, l0, l1))
        steps.append(step)
        if result.breaking_step is None and step.efficiency < threshold:
            result.breaking_step = step
            result.knee = int(c0)
    result.steps = steps
    return result


def _pct(x: float) -> str:
    pct = 100 * x
    return f"{pct:.1f}%" if abs(pct) < 10 else f"{pct:.0f}%"


def knee_sentence(k: Knee) -> str:
    """'knee at 128: 128 -> 256 buys 2.8% throughput for 89% more latency', or why there is none."""
    if not k.steps:
        return "no knee: the sweep needs at least two concurrency levels"
    if k.knee is None or k.breaking_step is None:
        last = k.steps[-1]
        worst = min(k.steps, key=lambda s: s.efficiency)
        if math.isinf(worst.efficiency):
            return (f"no knee within the sweep: up to {last.to_conc} every step bought "
                    "throughput without adding latency")
        return (f"no knee within the sweep: every step up to {last.to_conc} kept efficiency "
                f">= {k.threshold:g} (lowest {worst.efficiency:.2f}, "
                f"{worst.from_conc} -> {worst.to_conc})")
    s = k.breaking_step
    gain = s.throughput_gain
    verb = "buys" if gain >= 0 else "loses"
    return (f"knee at {k.knee}: {s.from_conc} -> {s.to_conc} {verb} {_pct(abs(gain))} throughput "
            f"for {_pct(s.latency_gain)} more latency")
