"""`lab sweep --rate auto` / `--conc auto`: find the highest load that passes, in a bounded
number of levels (docs/open-loop.md "Finding the saturation rate", "Finding the SLO edge").

`--rate auto` starts from the closed-loop throughput at AUTO_CONCURRENCY (what the stack
completes when it is kept busy); `--conc auto` starts at AUTO_CONCURRENCY itself. Either
brackets the edge by stepping by its growth factor until one level passes and a higher one does
not, then bisects the bracket until it is within RESOLUTION (for concurrency: adjacent integers)
or `max_levels` levels have run. A rate level passes when it is sustained, or, with SLOs given,
when its share of requests meeting every SLO reaches `--slo-share`; a concurrency level passes
on the SLO share. The answer is the highest passing level, and the bracket says how sure it is:
the level just above it did not pass.
"""

from __future__ import annotations

import math

#: The closed-loop level whose throughput is the first rate tried, and the first concurrency.
AUTO_CONCURRENCY = 32
#: Levels at most (the closed-loop level of `--rate auto` not counted), unless --max-levels.
MAX_LEVELS = 8
#: Bracketing step of a rate: up (x GROW) after a passing level, down (/ GROW) after one that
#: was not.
GROW = 1.5
#: Bracketing step of a concurrency: doubling reaches 1 or 1024 from 32 in 5 steps.
CONC_GROW = 2.0
#: Bisection stops when the bracket is this narrow, relative to its passing end.
RESOLUTION = 0.05


def _round(rate: float) -> float:
    return round(rate, 1) if rate >= 10 else round(rate, 3)


def next_level(start: float, tried: list[tuple[float, bool]], *, grow: float = GROW,
               max_levels: int = MAX_LEVELS, integer: bool = False) -> float | None:
    """The next level to try after `tried` [(level, passed)], or None when the search is done.
    `integer`: levels are whole numbers >= 1 (concurrency), and the search ends when the
    bracket is two adjacent integers or a level that fails at 1."""
    def rnd(x: float, down: bool = False) -> float:
        if not integer:
            return _round(x)
        return float(max(1, math.floor(x) if down else math.ceil(x)))

    if not tried:
        return rnd(start)
    if len(tried) >= max_levels:
        return None
    passed = [r for r, ok in tried if ok]
    lo = max(passed, default=None)
    above = [r for r, ok in tried if not ok and (lo is None or r > lo)]
    hi = min(above, default=None)
    if hi is None:
        assert lo is not None
        return rnd(lo * grow)
    if lo is None:
        nxt = rnd(hi / grow, down=True)
        return nxt if nxt < hi else None
    if (hi - lo) / lo <= RESOLUTION:
        return None
    mid = rnd((lo + hi) / 2, down=True)
    return mid if lo < mid < hi else None


def next_rate(start: float, tried: list[tuple[float, bool]],
              max_levels: int = MAX_LEVELS) -> float | None:
    """The next rate to try after `tried` [(rate, passed)], or None when the search is done."""
    return next_level(start, tried, max_levels=max_levels)


def next_concurrency(tried: list[tuple[float, bool]],
                     max_levels: int = MAX_LEVELS) -> int | None:
    """The next concurrency to try after `tried` [(concurrency, passed)], or None when done."""
    nxt = next_level(AUTO_CONCURRENCY, tried, grow=CONC_GROW, max_levels=max_levels,
                     integer=True)
    return None if nxt is None else int(nxt)
