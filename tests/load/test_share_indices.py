"""`share_indices`: a level's request indices split over client processes that share no counter
(the Ray actors): disjoint, covering every index, in proportion to each process's slots, and
the warm-up (the first C indices) one per slot."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from lab.load.client import share_indices, split_share


@given(n=st.integers(0, 500), concurrency=st.integers(1, 40), procs=st.integers(1, 8))
def test_disjoint_cover_in_proportion(n: int, concurrency: int, procs: int) -> None:
    sets = share_indices(n, concurrency, procs)
    shares = split_share(concurrency, procs)
    assert len(sets) == len(shares)
    flat = [i for s in sets for i in s]
    assert sorted(flat) == list(range(n))  # every index exactly once
    for s, share in zip(sets, shares, strict=True):
        assert len(s) == len(list(s))
        assert list(s) == sorted(s)  # claimed in order
        # each round of C indices gives the process exactly its slots' share
        assert sum(1 for i in s if i < concurrency * (n // concurrency)) == share * (
            n // concurrency)
    warm = [sum(1 for i in s if i < concurrency) for s in sets]
    if n >= concurrency:
        assert warm == shares


def test_lazy_for_a_timed_level() -> None:
    _, s = share_indices(10**9, 4, 2)  # slots 2 and 3 of every 4
    assert len(s) == 5 * 10**8 and s[0] == 2 and s[1] == 3 and s[2] == 6
