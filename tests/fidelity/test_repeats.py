"""lab/fidelity/repeats.py: the gap over repeats, its paired interval, the per-repeat median."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from lab.fidelity.repeats import interval, median_levels, repeat_gaps


def levels(ttft: float, req_s: float = 10.0) -> pd.DataFrame:
    return pd.DataFrame({"concurrency": [32], "ttft_ms_p50": [ttft], "req_s": [req_s]})


def test_the_gap_is_of_the_medians_and_the_per_repeat_gaps_have_their_own_median() -> None:
    target = [levels(t) for t in (100.0, 100.0, 100.0, 100.0)]
    lab = [levels(x) for x in (104.0, 106.0, 110.0, 90.0)]
    g = next(g for g in repeat_gaps(target, lab) if g.metric == "ttft_ms_p50")
    assert (g.target, g.lab) == (100.0, 105.0)
    assert g.gap_pct == pytest.approx(5.0) and g.verdict == "within 5%"
    assert g.repeat_gap_pct == pytest.approx(5.0)  # median of +4, +6, +10, -10
    assert -10.0 <= g.low_pct <= g.gap_pct <= g.high_pct <= 10.0
    assert g.target_repeats == [100.0] * 4 and g.lab_repeats == [104.0, 106.0, 110.0, 90.0]
    assert g.target_spread_pct == 0.0


def test_the_target_spread_is_its_own_range_over_the_repeats() -> None:
    """A target whose p50 moves 230-276 ms between repeats (median 250): a 20% spread, wider
    than any gap a 5% verdict can resolve; a target seen once has no spread."""
    target = [levels(t) for t in (230.0, 276.0, 250.0, 240.0, 260.0)]
    lab = [levels(x) for x in (250.0, 251.0, 252.0, 253.0, 254.0)]
    g = next(g for g in repeat_gaps(target, lab) if g.metric == "ttft_ms_p50")
    assert g.target_spread_pct == pytest.approx(100.0 * 46.0 / 250.0)
    once = next(g for g in repeat_gaps(target[:1], lab[:1]) if g.metric == "ttft_ms_p50")
    assert math.isnan(once.target_spread_pct)


def test_the_interval_resamples_repeats_in_pairs() -> None:
    """Both sides drift together from repeat to repeat, the lab 5% above the target in each:
    resampled in pairs the gap is 5% whatever the draw (unpaired it would not be)."""
    target = [100.0, 200.0, 100.0, 200.0, 150.0]
    lab = [1.05 * t for t in target]
    low, high = interval(target, lab)
    assert low == pytest.approx(5.0) and high == pytest.approx(5.0)


def test_a_repeat_missing_a_level_is_left_out_and_unequal_sides_are_refused() -> None:
    target = [levels(100.0), levels(100.0), pd.DataFrame({"concurrency": [1], "req_s": [1.0]})]
    lab = [levels(110.0), levels(120.0), levels(500.0)]
    g = next(g for g in repeat_gaps(target, lab) if g.metric == "ttft_ms_p50")
    assert (g.target, g.lab) == (100.0, 115.0)  # the target's third repeat has no c=32
    assert g.repeat_gap_pct == pytest.approx(15.0)
    assert median_levels(lab).set_index("concurrency").loc[32, "ttft_ms_p50"] == 120.0
    with pytest.raises(ValueError, match="2 target repeats against 3 lab repeats"):
        repeat_gaps(target[:2], lab)


def test_repeats_of_open_loop_levels_pair_by_rate() -> None:
    target = [pd.DataFrame({"concurrency": [0, 0], "rate": [2.0, 4.0], "req_s": [2.0, v]})
              for v in (4.0, 3.0)]
    lab = [pd.DataFrame({"concurrency": [0, 0], "rate": [4.0, 2.0], "req_s": [v, 2.0]})
           for v in (3.6, 3.3)]
    g = next(g for g in repeat_gaps(target, lab) if g.metric == "req_s" and g.rate == 4.0)
    assert g.level == "rate=4/s" and g.target_repeats == [4.0, 3.0]
    assert g.lab_repeats == [3.6, 3.3] and g.target_spread_pct == pytest.approx(100 / 3.5)
    medians = median_levels(lab).set_index("rate")
    assert medians.loc[4.0, "req_s"] == pytest.approx(3.45) and len(medians) == 2
