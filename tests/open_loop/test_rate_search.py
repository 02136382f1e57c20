"""`--rate auto`'s search: bracket from the closed-loop throughput, then bisect, bounded."""

from __future__ import annotations

from lab.open_loop.rate_search import (
    AUTO_CONCURRENCY,
    GROW,
    MAX_LEVELS,
    RESOLUTION,
    next_concurrency,
    next_rate,
)


def search(start: float, ceiling: float) -> list[tuple[float, bool]]:
    """The rates the search tries against a stack that sustains exactly up to `ceiling`."""
    tried: list[tuple[float, bool]] = []
    while (rate := next_rate(start, tried)) is not None:
        tried.append((rate, rate <= ceiling))
    return tried


def bracket(tried: list[tuple[float, bool]]) -> tuple[float, float]:
    lo = max(r for r, ok in tried if ok)
    return lo, min(r for r, ok in tried if not ok and r > lo)


def test_starts_at_the_closed_loop_throughput_and_brackets_upwards() -> None:
    tried = search(100.0, 260.0)
    assert tried[0] == (100.0, True)
    assert tried[1] == (100.0 * GROW, True) and tried[2] == (100.0 * GROW**2, True)
    lo, hi = bracket(tried)
    assert lo <= 260.0 < hi
    assert len(tried) <= MAX_LEVELS


def test_brackets_downwards_then_bisects_to_the_resolution() -> None:
    tried = search(400.0, 130.0)
    assert [ok for _, ok in tried[:3]] == [False, False, False]
    lo, hi = bracket(tried)
    assert lo <= 130.0 < hi
    assert (hi - lo) / lo <= RESOLUTION or len(tried) == MAX_LEVELS


def test_is_bounded_however_far_the_ceiling() -> None:
    assert len(search(1.0, 1e6)) == MAX_LEVELS


def conc_search(edge: int, max_levels: int = MAX_LEVELS) -> list[tuple[float, bool]]:
    """The concurrencies `--conc auto` tries against a stack whose SLO holds up to `edge`."""
    tried: list[tuple[float, bool]] = []
    while (c := next_concurrency(tried, max_levels)) is not None:
        tried.append((c, c <= edge))
    return tried


def test_the_concurrency_search_halves_then_bisects_to_adjacent_integers() -> None:
    tried = conc_search(5)
    assert [c for c, _ in tried[:4]] == [AUTO_CONCURRENCY, 16, 8, 4]
    lo, hi = bracket(tried)
    assert (lo, hi) == (5, 6)
    assert len(tried) <= MAX_LEVELS


def test_the_concurrency_search_doubles_up_and_stops_at_max_levels() -> None:
    tried = conc_search(10**6, max_levels=4)
    assert [c for c, _ in tried] == [32, 64, 128, 256]


def test_the_concurrency_search_ends_when_even_one_fails() -> None:
    tried = conc_search(0)
    assert [c for c, _ in tried] == [32, 16, 8, 4, 2, 1]


def test_max_levels_bounds_the_rate_search() -> None:
    tried: list[tuple[float, bool]] = []
    while (rate := next_rate(10.0, tried, 3)) is not None:
        tried.append((rate, True))
    assert len(tried) == 3
