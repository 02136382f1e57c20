"""The knee rule with the tables of docs/metrics.md "The knee" as the test vectors: the reference
stack's sweep, and the lab's default `lab sweep` (speedup 1000), whose fast c=1 level put the
knee at 1 under the former rule (ratio of relative changes)."""

from __future__ import annotations

import math

import pytest

from lab.analysis.knee import find_knee

CONC = [1, 32, 128, 256]
REQ_S = [22.0, 533.5, 1013.6, 1041.7]
LAT_MS = [44.0, 56.3, 119.3, 225.0]


#: `lab sweep` defaults (c=1/32/128/256, speedup 1000) at 6e175be, levels.json of one run.
LAB_REQ_S = [201.43, 417.96, 451.12, 454.77]
LAB_LAT_MS = [4.837, 71.88, 268.07, 526.03]


def test_reference_table() -> None:
    k = find_knee(CONC, REQ_S, LAT_MS)
    assert k.knee == 128
    assert k.efficiencies[32] == pytest.approx(12.93, abs=0.005)
    assert k.efficiencies[128] == pytest.approx(0.85, abs=0.005)
    assert k.efficiencies[256] == pytest.approx(0.043, abs=0.0005)
    assert k.sentence() == "knee at 128: 128 -> 256 buys 2.8% throughput for 89% more latency"


def test_default_lab_sweep_knee_is_where_throughput_flattens() -> None:
    """1 -> 32 doubles throughput (latency x15 from a 5 ms base): not the knee; 32 -> 128 buys
    8% for 3.7x the latency: the knee is 32."""
    k = find_knee(CONC, LAB_REQ_S, LAB_LAT_MS)
    assert k.knee == 32
    assert k.efficiencies[32] == pytest.approx(0.27, abs=0.005)
    assert k.efficiencies[128] == pytest.approx(0.058, abs=0.0005)
    assert k.sentence() == "knee at 32: 32 -> 128 buys 7.9% throughput for 273% more latency"


def test_efficiency_is_symmetric_in_log_terms() -> None:
    """Doubling throughput for doubled latency scores 1 wherever the step starts."""
    for base in (1.0, 5.0, 500.0):
        k = find_knee([1, 4], [100.0, 200.0], [base, 2 * base])
        assert k.efficiencies[4] == pytest.approx(1.0)


def test_order_does_not_matter() -> None:
    assert find_knee(CONC[::-1], REQ_S[::-1], LAT_MS[::-1]).knee == 128


def test_threshold_configurable() -> None:
    assert find_knee(CONC, REQ_S, LAT_MS, threshold=1.0).knee == 32
    assert find_knee(CONC, REQ_S, LAT_MS, threshold=0.01).knee is None


def test_no_knee_is_said() -> None:
    k = find_knee(CONC[:3], REQ_S[:3], LAT_MS[:3])
    assert k.knee is None
    assert k.sentence().startswith("no knee within the sweep")
    assert "128" in k.sentence()


def test_latency_that_did_not_rise_is_infinite_efficiency() -> None:
    k = find_knee([1, 2], [10, 20], [5, 5])
    assert math.isinf(k.efficiencies[2]) and k.knee is None


def test_falling_throughput_is_a_knee() -> None:
    k = find_knee([1, 2, 4], [10, 20, 15], [5, 6, 9])
    assert k.knee == 2
    assert "loses 25% throughput" in k.sentence()


def test_single_level() -> None:
    assert "at least two" in find_knee([8], [1.0], [1.0]).sentence()
