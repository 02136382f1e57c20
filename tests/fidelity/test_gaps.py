"""lab/fidelity/gaps.py: the gap, the verdict words and the disaggregation cost."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from lab.fidelity.gaps import disagg_cost, gap_pct, level_gaps, verdict


def test_verdict_bands() -> None:
    assert [verdict(g) for g in (0.0, -5.0, 5.01, -10.0, 10.5, math.nan)] == [
        "within 5%", "within 5%", "within 10%", "within 10%", "off", "n/a"]


def test_gap_is_relative_to_the_target() -> None:
    assert gap_pct(100.0, 95.0) == pytest.approx(-5.0)
    assert math.isnan(gap_pct(0.0, 1.0)) and math.isnan(gap_pct(math.nan, 1.0))


def test_level_gaps_cover_the_levels_both_sides_ran() -> None:
    target = pd.DataFrame({"concurrency": [1, 32], "req_s": [10.0, 100.0]})
    lab = pd.DataFrame({"concurrency": [32, 128], "req_s": [108.0, 300.0]})
    gaps = [g for g in level_gaps(target, lab) if g.metric == "req_s"]
    assert [(g.concurrency, g.verdict) for g in gaps] == [(32, "within 10%")]


def test_disagg_cost_is_req_s_lost_vs_aggregated() -> None:
    agg = pd.DataFrame({"concurrency": [1, 32, 128], "req_s": [5.0, 100.0, 200.0]})
    dis = pd.DataFrame({"concurrency": [1, 32, 128], "req_s": [5.0, 80.0, 210.0]})
    assert disagg_cost(agg, dis) == {32: pytest.approx(20.0), 128: pytest.approx(-5.0)}


def test_open_loop_levels_line_up_by_offered_rate_apart_from_closed_ones() -> None:
    """Open-loop rows (concurrency 0) line up by rate; a closed-loop row at the same
    concurrency is another level; a trace's rate level is named 'trace'."""
    nan = math.nan
    target = pd.DataFrame({"concurrency": [32, 0, 0], "rate": [nan, 2.0, 4.0],
                           "req_s": [10.0, 2.0, 4.0]})
    lab = pd.DataFrame({"concurrency": [0, 0, 32], "rate": [4.0, 2.0, nan],
                        "req_s": [4.4, 1.9, 11.0]})
    gaps = [g for g in level_gaps(target, lab) if g.metric == "req_s"]
    assert [(g.level, g.concurrency, g.rate, g.target, g.lab) for g in gaps] == [
        ("c=32", 32, None, 10.0, 11.0), ("rate=2/s", 0, 2.0, 2.0, 1.9),
        ("rate=4/s", 0, 4.0, 4.0, 4.4)]
    one = pd.DataFrame({"concurrency": [0], "rate": [3.25], "req_s": [3.0]})
    (g,) = [g for g in level_gaps(one, one, trace=True) if g.metric == "req_s"]
    assert g.level == "trace" and g.gap_pct == 0.0
