"""The SLO share of a level, its Wilson interval, and the edge sentence of a search."""

from __future__ import annotations

import pandas as pd
import pytest

from lab.analysis.slo_share import SLOs, slo_edge, slo_figures, wilson


def test_wilson_interval_matches_the_textbook_values() -> None:
    # 1000 of 1000 good: the share is only known to be above 99.6%
    lo, hi = wilson(1000, 1000)
    assert hi == 1.0 and lo == pytest.approx(0.99617, abs=1e-5)
    lo, hi = wilson(50, 100)
    assert (lo, hi) == (pytest.approx(0.40383, abs=1e-5), pytest.approx(0.59617, abs=1e-5))
    assert wilson(0, 0) == (0.0, 1.0)


def test_a_failed_request_counts_against_the_share() -> None:
    measured = pd.DataFrame({"ttft_ms": [10.0, 20.0, 30.0, None], "latency_ms": [50.0] * 4,
                             "itl_ms": [1.0] * 4, "ok": [True, True, True, False]})
    ok = measured[measured["ok"]]
    fig = slo_figures(measured, ok, SLOs(ttft_ms=25), duration_s=2.0)
    assert fig["slo_good"] == 2 and fig["slo_share"] == 0.5 and fig["goodput_req_s"] == 1.0


def _levels(rows: list[tuple[int, int, float]]) -> pd.DataFrame:
    out = []
    for c, n, share in rows:
        lo, hi = wilson(round(share * n), n)
        out.append({"concurrency": c, "requests": n, "slo_share": share, "slo_share_lo": lo,
                    "slo_share_hi": hi})
    return pd.DataFrame(out)


def test_the_edge_is_the_highest_pass_below_the_first_failure_above_it() -> None:
    levels = _levels([(32, 100, 0.2), (16, 100, 0.7), (8, 100, 1.0), (12, 100, 0.99),
                      (14, 100, 0.9)])
    edge = slo_edge(levels, "concurrency", 0.99, SLOs(latency_ms=100), 8)
    assert edge is not None and edge.passed is not None and edge.failed is not None
    assert (edge.passed.load, edge.failed.load, edge.levels) == (12, 14, 5)
    text = edge.sentence()
    assert "c=12 is the highest that passed" in text and "c=14 did not" in text
    assert "within 17% above c=12" in text and "5 concurrency levels of at most 8" in text
    # 99 of 100 good: the interval reaches below 99%, and the sentence says so
    assert "interval reaches below 99%" in text


def test_no_level_passing_is_said() -> None:
    edge = slo_edge(_levels([(32, 50, 0.0), (16, 50, 0.1)]), "concurrency", 0.99,
                    SLOs(ttft_ms=5), 8)
    assert edge is not None and edge.passed is None
    assert "no level passed, not even c=16" in edge.sentence()
