"""The knee rule with the reference table of docs/metrics.md "The knee" as the test vector."""

from __future__ import annotations

import math

import pytest

from lab.analysis.knee import find_knee

CONC = [1, 32, 128, 256]
REQ_S = [22.0, 533.5, 1013.6, 1041.7]
LAT_MS = [44.0, 56.3, 119.3, 225.0]


def test_reference_table() -> None:
    k = find_knee(CONC, REQ_S, LAT_MS)
    assert k.knee == 128
    assert k.efficiencies[32] == pytest.approx(83.2, abs=0.05)
    assert k.efficiencies[128] == pytest.approx(0.80, abs=0.005)
    assert k.efficiencies[256] == pytest.approx(0.03, abs=0.005)
    assert k.sentence() == "knee at 128: 128 -> 256 buys 2.8% throughput for 89% more latency"


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
