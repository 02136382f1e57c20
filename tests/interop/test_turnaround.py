"""A closed loop's turnaround sets which mode its TTFT p50 is in (tests/interop/turnaround.py,
docs/fidelity.md "The closed loop's turnaround"): the engine model's own behaviour, on a
simulated clock."""

from __future__ import annotations

from tests.interop.closed_loop import lab_closed_loop


def test_a_successor_later_than_one_decode_pass_waits_a_whole_pass_more() -> None:
    # ISL 1024 / OSL 64 at c=32: a plain decode pass is ~7.5 ms, a prefill pass ~170 ms
    runs = {d: lab_closed_loop(1024, 64, 32, 32 * 5, turnaround_ms=d, warmup=32)
            for d in (2.0, 4.0, 10.0, 12.0)}
    for early in (2.0, 4.0):
        for late in (10.0, 12.0):
            assert runs[late].median_ttft_ms > runs[early].median_ttft_ms + 150.0, runs
            # the same work split the other way: the first token later, the rest faster
            assert runs[late].median_tpot_ms < runs[early].median_tpot_ms * 0.9, runs
    # within a mode the turnaround only moves TTFT by itself
    assert abs(runs[4.0].median_ttft_ms - runs[2.0].median_ttft_ms) < 5.0, runs


def test_no_turnaround_is_the_replay_closed_loop() -> None:
    """turnaround 0 adds a successor in time for the next pass, as Dynamo's replay does."""
    base = lab_closed_loop(136, 128, 8, 32)
    assert lab_closed_loop(136, 128, 8, 32, turnaround_ms=0.0) == base
    assert lab_closed_loop(136, 128, 8, 32, turnaround_ms=0.5) != base
