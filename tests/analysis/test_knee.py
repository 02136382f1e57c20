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
    assert k.sentence().startswith(
        "knee at 128: 128 -> 256 buys 2.8% throughput for 89% more latency (one run per level")


def test_default_lab_sweep_knee_is_where_throughput_flattens() -> None:
    """1 -> 32 doubles throughput (latency x15 from a 5 ms base): not the knee; 32 -> 128 buys
    8% for 3.7x the latency: the knee is 32."""
    k = find_knee(CONC, LAB_REQ_S, LAB_LAT_MS)
    assert k.knee == 32
    assert k.efficiencies[32] == pytest.approx(0.27, abs=0.005)
    assert k.efficiencies[128] == pytest.approx(0.058, abs=0.0005)
    assert k.sentence().startswith(
        "knee at 32: 32 -> 128 buys 7.9% throughput for 273% more latency (")


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


#: A default `lab sweep` on a busy 2-core machine (levels.csv of one run): 128 dipped, 256 won
#: it back and more. The former rule said "knee at 32: 32 -> 128 loses 7.8% throughput".
DIP_REQ_S = [123.1, 168.4, 155.4, 170.0]
DIP_LAT_MS = [7.8, 154.6, 512.8, 495.9]


def test_a_dip_that_a_later_level_wins_back_is_not_read_as_the_knee() -> None:
    """32 -> 128 loses throughput, but 256 is above 32: the knee is read from 32 -> 256 (what
    the extra concurrency finally bought), and the sentence never says 'loses'."""
    k = find_knee(CONC, DIP_REQ_S, DIP_LAT_MS)
    assert k.knee == 32
    assert k.breaking_step is not None and k.breaking_step.to_conc == 256
    assert k.sentence().startswith("knee at 32: 32 -> 256 buys 1.0% throughput for 221% more")
    assert "loses" not in k.sentence()


def test_a_dip_followed_by_a_level_well_above_it_is_passed_over() -> None:
    """32 -> 128 loses 4.4%, then 256 is 33% above 32 for a third more latency (a level that
    was slow by accident): 32 is not the knee, and the sentence names the dip."""
    k = find_knee([1, 32, 128, 256], [100.0, 150.0, 143.4, 200.0], [10.0, 213.0, 892.0, 600.0])
    assert k.knee is None
    assert [(d.from_conc, d.to_conc, a.to_conc) for d, a in k.dips] == [(32, 128, 256)]
    assert "32 -> 128 loses 4.4% throughput but 256 is 33% above 32" in k.sentence()


def test_the_issue_44_sweep_reads_the_knee_past_the_dip() -> None:
    """The sweep that said 'knee at 32: 32 -> 128 loses 4.4% throughput' while 256 gave 18%
    more than 128 (closed loop: latency = c / req/s): the knee is still 32, since 256 bought
    13% over 32 for 7x its latency, and the sentence says that, not the dip."""
    req_s = [100.0, 150.0, 143.4, 169.2]
    lat = [1000.0 * c / t for c, t in zip(CONC, req_s, strict=True)]
    k = find_knee(CONC, req_s, lat)
    assert k.knee == 32
    assert k.sentence().startswith("knee at 32: 32 -> 256 buys 13% throughput for 609% more")


def test_the_sentence_says_how_sure_it_is() -> None:
    one = find_knee(CONC, REQ_S, LAT_MS)
    assert "one run per level" in one.sentence() and "--repeat" in one.sentence()
    three = find_knee(CONC, REQ_S, LAT_MS, repeats=3, spread_pct=4.25)
    assert "means of 3 repeats; req/s varied by up to 4.2% within a level" in three.sentence()
