"""The knee rule (docs/metrics.md "The knee").

For levels sorted by concurrency, with request throughput T and average latency L, the marginal
efficiency of step i is

    e_i = ln(T_i / T_{i-1}) / ln(L_i / L_{i-1})     (latency that did not rise: e_i = +inf)

The knee is the last level before the first step whose efficiency falls below the threshold
(0.1 by default), provided that every later level, measured from it, falls below the threshold
too; otherwise that step was a dip (one noisy level that a later level more than wins back) and
the search goes on. If no step qualifies, there is no knee within the sweep. The sentence says
how sure the reading is: the spread of req/s over repeats, or that one run per level leaves
run-to-run noise unmeasured.

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
    breaking_step: Step | None = None  # what the knee is read from (see find_knee)
    dips: list[tuple[Step, Step]] = field(default_factory=list)  # (step, later level above it)
    repeats: int = 1  # runs per level the figures are means of
    spread_pct: float | None = None  # largest min-max spread of req/s within a level, in %

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


def _step(a: tuple[int, float, float], b: tuple[int, float, float]) -> Step:
    (c0, t0, l0), (c1, t1, l1) = a, b
    return Step(int(c0), int(c1), t1 / t0 - 1 if t0 else math.inf,
                l1 / l0 - 1 if l0 else math.inf, efficiency(t0, t1, l0, l1))


def find_knee(concurrency: Sequence[int], throughput: Sequence[float],
              latency: Sequence[float], threshold: float = DEFAULT_THRESHOLD,
              repeats: int = 1, spread_pct: float | None = None) -> Knee:
    """The knee (docs/metrics.md "The knee"). A level whose next step falls below the threshold
    is the knee only if every later level, measured from it, falls below it too: a step that
    loses throughput followed by a level that more than wins it back is a dip (one noisy level),
    not the knee. `repeats` and `spread_pct` (the widest min-max of req/s within a level, over
    repeats) say how sure the reading is; the sentence reports them."""
    levels = sorted(zip(concurrency, throughput, latency, strict=True))
    result = Knee(knee=None, threshold=threshold, repeats=repeats, spread_pct=spread_pct)
    result.steps = [_step(a, b) for a, b in itertools.pairwise(levels)]
    for i, step in enumerate(result.steps):
        if step.efficiency >= threshold:
            continue
        later = [_step(levels[i], b) for b in levels[i + 2:]]
        above = next((s for s in later if s.efficiency >= threshold), None)
        if above is not None:
            result.dips.append((step, above))
            continue
        best = max([step, *later], key=lambda s: s.throughput_gain)
        result.knee = int(levels[i][0])
        # a step that lost throughput while a later level gained it: read the knee from that
        # later level (what the extra concurrency finally bought), never from the dip
        result.breaking_step = best if step.throughput_gain < 0 < best.throughput_gain else step
        break
    return result


def _pct(x: float) -> str:
    pct = 100 * x
    return f"{pct:.1f}%" if abs(pct) < 10 else f"{pct:.0f}%"


def _certainty(k: Knee) -> str:
    """How sure a knee read from these figures is."""
    if k.repeats > 1 and k.spread_pct is not None:
        return (f"means of {k.repeats} repeats; req/s varied by up to {k.spread_pct:.1f}% "
                "within a level")
    return ("one run per level, so run-to-run noise is unmeasured: a step of a few % may be "
            "noise; --repeat N measures it")


def _dips(k: Knee) -> str:
    return "; ".join(f"{d.from_conc} -> {d.to_conc} {'loses' if d.throughput_gain < 0 else 'buys'}"
                     f" {_pct(abs(d.throughput_gain))} throughput but {a.to_conc} is "
                     f"{_pct(a.throughput_gain)} above {a.from_conc}, a dip rather than the knee"
                     for d, a in k.dips)


def knee_sentence(k: Knee) -> str:
    """'knee at 128: 128 -> 256 buys 2.8% throughput for 89% more latency (...)', or why there
    is none; in brackets, how sure it is and any dip passed over."""
    if not k.steps:
        return "no knee: the sweep needs at least two concurrency levels"
    notes = "; ".join(n for n in (_dips(k), _certainty(k)) if n)
    if k.knee is None or k.breaking_step is None:
        last = k.steps[-1]
        worst = min(k.steps, key=lambda s: s.efficiency)
        if math.isinf(worst.efficiency):
            return (f"no knee within the sweep: up to {last.to_conc} every step bought "
                    "throughput without adding latency")
        if k.dips:
            return f"no knee within the sweep up to {last.to_conc} ({notes})"
        return (f"no knee within the sweep: every step up to {last.to_conc} kept efficiency "
                f">= {k.threshold:g} (lowest {worst.efficiency:.2f}, "
                f"{worst.from_conc} -> {worst.to_conc}; {_certainty(k)})")
    s = k.breaking_step
    gain = s.throughput_gain
    verb = "buys" if gain >= 0 else "loses"
    return (f"knee at {k.knee}: {s.from_conc} -> {s.to_conc} {verb} {_pct(abs(gain))} throughput "
            f"for {_pct(s.latency_gain)} more latency ({notes})")
