"""lab/fidelity/suite.py: the held-out suite's definition and its one table (pure)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from lab.commands.fidelity import client_health_notes, fixed_rates
from lab.fidelity.gaps import METRICS, Gap
from lab.fidelity.suite import (
    SUITE,
    SuiteRow,
    open_requests,
    suite_markdown,
    suite_rows,
    summary,
    trace_spec,
)
from lab.load.sweep import SweepPlan


def test_the_suite_is_the_documented_workloads() -> None:
    shapes = {e.name: (e.isl, e.osl, e.conc, e.fractions, e.trace_fraction) for e in SUITE}
    assert shapes == {
        "isl512-osl64": (512, 64, (1, 8, 32), (), None),
        "isl2048-osl32": (2048, 32, (1, 8, 32), (), None),
        "poisson-near-sat": (136, 128, (), (0.5, 0.8, 1.0), None),
        "prefix-trace": (512, 64, (), (), 0.5)}
    poisson = SUITE[2]
    assert poisson.rates(12.0) == [6.0, 9.6, 12.0]
    assert open_requests(12.0, None) == 180 and open_requests(12.0, 5) == 5
    spec = trace_spec(SUITE[3], 12.0, None, 3)
    assert (spec.requests, spec.rate, spec.prefix_groups, spec.seed) == (240, 6.0, 4, 3)
    assert trace_spec(SUITE[3], 12.0, 9, 3).requests == 9


def _gaps(level: str, values: dict[str, tuple[float, float]]) -> list[Gap]:
    return [Gap(0, m, label, t, x, 100 * (x - t) / t, "", level=level)
            for m, label in METRICS for t, x in [values.get(m, (1.0, 1.0))]]


def test_one_table_and_the_mean_absolute_gap_per_metric_and_side() -> None:
    gaps = {"isl512-osl64": {"lab": _gaps("c=1", {"req_s": (10.0, 11.0)}),
                             "linear": _gaps("c=1", {"req_s": (10.0, 7.0)})},
            "prefix-trace": {"lab": _gaps("trace", {"req_s": (10.0, 9.4)}),
                             "linear": _gaps("trace", {"req_s": (10.0, 10.0)})}}
    rows = suite_rows(gaps, list(SUITE))
    assert len(rows) == 2 * len(METRICS)
    req = [r for r in rows if r.metric == "req_s"]
    assert [(r.entry, r.level, r.sides["lab"][1]) for r in req] == [
        ("isl512-osl64", "c=1", pytest.approx(10.0)), ("prefix-trace", "trace",
                                                       pytest.approx(-6.0))]
    stats = summary(rows, ["lab", "linear"])
    assert stats["lab"]["req_s"]["mean_abs_gap_pct"] == pytest.approx(8.0)
    assert stats["lab"]["req_s"]["within_5_pct"] == 0.0
    assert stats["lab"]["req_s"]["within_10_pct"] == 100.0
    assert stats["linear"]["req_s"]["within_5_pct"] == 50.0
    assert stats["lab"]["all"]["levels"] == 2 * len(METRICS)
    assert math.isnan(rows[0].target_spread_pct)
    md = suite_markdown(rows, [("lab", "profile fit"), ("linear", "linear fit")], stats, [])
    assert "| req/s | prefix-trace | trace | 10.00 | 9.40 | -6.0% | 10.00 | +0.0% | - |" in md
    assert "| linear fit | req/s | 2 | 15.0% | 50% | 50% | 50% | - |" in md


def test_the_share_of_gaps_within_the_targets_own_spread() -> None:
    """A gap no larger than the target's range over the repeats counts as within its spread;
    levels without a spread (one repeat) are left out of that share."""
    rows = [SuiteRow("req_s", "req/s", "isl512-osl64", "c=1", 10.0, {"lab": (10.5, 5.0)}, 6.0),
            SuiteRow("req_s", "req/s", "isl512-osl64", "c=8", 10.0, {"lab": (8.0, -20.0)}, 6.0),
            SuiteRow("req_s", "req/s", "isl512-osl64", "c=32", 10.0, {"lab": (9.0, -10.0)},
                     math.nan)]
    stats = summary(rows, ["lab"])["lab"]["req_s"]
    assert stats["within_spread_pct"] == 50.0
    assert stats["levels"] == 3
    one_repeat = summary(rows[2:], ["lab"])["lab"]["req_s"]
    assert math.isnan(one_repeat["within_spread_pct"])
    md = suite_markdown(rows, [("lab", "lab")], summary(rows, ["lab"]), [])
    assert "| lab | req/s | 3 | 11.7% | 33% | 67% | 67% | 50% |" in md


def test_a_sweep_whose_client_lagged_is_named_under_the_table() -> None:
    """The target's side of a suite on a 2-core CPU engine can starve the load client: the
    report names the sweep and level whose event loop lagged, and says all kept up otherwise."""
    kept = pd.DataFrame({"concurrency": [1], "rate": [math.nan], "client_cpu_pct_max_proc": [2.0],
                         "loop_lag_p99_ms": [0.8], "ttft_ms_p50": [90.0],
                         "client_cpu_ms_per_req": [2.0]})
    lagged = kept.assign(loop_lag_p99_ms=[591.0])
    notes = client_health_notes({("isl2048-osl32", "target", 2): lagged,
                                 ("isl2048-osl32", "lab", 2): kept}, repeat=2)
    assert "## Client health" in notes
    assert "isl2048-osl32, target, repeat 2: the client's event loop lagged at c=1" in notes
    assert "lab, repeat 2" not in notes
    assert "every sweep's client kept up" in client_health_notes(
        {("isl2048-osl32", "target", 1): kept}, repeat=1)


def test_rate_auto_sweeps_the_lab_at_the_targets_levels() -> None:
    plan = SweepPlan(concurrency=[], rate_auto=True)
    levels = pd.DataFrame({"concurrency": [32, 0, 0], "rate": [math.nan, 20.0, 10.0]})
    fixed = fixed_rates(plan, levels)
    assert (fixed.concurrency, fixed.rates, fixed.rate_auto) == ([32], [10.0, 20.0], False)
