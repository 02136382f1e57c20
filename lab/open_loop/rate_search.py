"""`lab sweep --rate auto`: find the highest rate the stack sustains in a bounded number of
levels (docs/open-loop.md "Finding the saturation rate").

It starts from the closed-loop throughput at AUTO_CONCURRENCY (what the stack completes when
it is kept busy), brackets the saturation rate by stepping by GROW until one rate is sustained
and a higher one is not, then bisects the bracket until it is within RESOLUTION or MAX_LEVELS
rate levels have run. The answer is the highest sustained rate, and the bracket says how sure
it is: the rate just above it was not sustained.
"""

from __future__ import annotations

#: The closed-loop level whose throughput is the first rate tried.
AUTO_CONCURRENCY = 32
#: Rate levels at most (the closed-loop level not counted).
MAX_LEVELS = 8
#: Bracketing step: up (x GROW) after a sustained rate, down (/ GROW) after one that was not.
GROW = 1.5
#: Bisection stops when the bracket is this narrow, relative to its sustained end.
RESOLUTION = 0.05


def _round(rate: float) -> float:
    return round(rate, 1) if rate >= 10 else round(rate, 3)


def next_rate(start: float, tried: list[tuple[float, bool]]) -> float | None:
    """The next rate to try after `tried` [(rate, sustained)], or None when the search is done."""
    if not tried:
        return _round(start)
    if len(tried) >= MAX_LEVELS:
        return None
    sustained = [r for r, ok in tried if ok]
    lo = max(sustained, default=None)
    above = [r for r, ok in tried if not ok and (lo is None or r > lo)]
    hi = min(above, default=None)
    if hi is None:
        assert lo is not None
        return _round(lo * GROW)
    if lo is None:
        return _round(hi / GROW)
    if (hi - lo) / lo <= RESOLUTION:
        return None
    mid = _round((lo + hi) / 2)
    return mid if lo < mid < hi else None
