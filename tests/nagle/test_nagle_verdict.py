"""The Nagle verdict's statistics on synthetic TTFT samples (no sockets)."""

from __future__ import annotations

import random

import pytest

from lab.nagle.kernel_facts import KernelFacts, kernel_facts, near_timer
from lab.nagle.stats import arm_results, sarle_bimodality, stall_stats
from lab.nagle.verdict import external_verdict, launched_verdict


def _fast(n: int, rng: random.Random, mu: float = 1.0) -> list[float]:
    return [max(0.05, rng.gauss(mu, 0.2)) for _ in range(n)]


def _stalled(n: int, rng: random.Random, mu: float = 44.0) -> list[float]:
    return [rng.gauss(mu, 0.6) for _ in range(n)]


FACTS = KernelFacts(system="Linux", release="6.1", hz=250, pingpong_thresh=1)


def test_bimodal_cluster_found_with_share_and_median() -> None:
    rng = random.Random(1)
    samples = _fast(40, rng) + _stalled(160, rng)
    s = stall_stats(samples)
    assert s.shape == "bimodal" and s.bimodal
    assert s.cluster_share == pytest.approx(0.8)
    assert s.cluster_median_ms == pytest.approx(44.0, abs=0.5)
    assert s.cluster_excess_ms == pytest.approx(43.0, abs=1.0)
    assert near_timer(s.cluster_excess_ms) == 1
    assert s.sarle_b is not None and s.sarle_b > 5 / 9


def test_nearly_all_stalled_is_measured_against_the_fast_mode_below_the_gap() -> None:
    # the first request of each connection is fast, every later one stalls: the p10 is in the
    # cluster, so the fast samples below the wide gap set the baseline
    rng = random.Random(2)
    samples = _fast(2, rng) + _stalled(38, rng)
    s = stall_stats(samples)
    assert s.p10_ms > 40
    assert s.baseline_ms < 2
    assert s.cluster_share == pytest.approx(38 / 40)
    assert s.shape == "stalled"


def test_unimodal_fast_has_no_cluster() -> None:
    rng = random.Random(3)
    s = stall_stats(_fast(200, rng))
    assert s.shape == "unimodal" and not s.bimodal
    assert s.cluster_n == 0 and s.cluster_share == 0.0 and s.cluster_median_ms is None


def test_single_outlier_is_not_a_second_mode() -> None:
    rng = random.Random(4)
    samples = [*_fast(199, rng), 45.0]
    s = stall_stats(samples)
    assert s.cluster_n == 1
    assert s.shape == "unimodal"
    assert s.sarle_b is not None and s.sarle_b > 5 / 9  # why Sarle's b does not decide alone


def test_unimodal_slow_alone_is_unimodal_and_against_a_fast_reference_stalled() -> None:
    rng = random.Random(5)
    slow = [rng.gauss(45.0, 2.0) for _ in range(100)]
    alone = stall_stats(slow)
    assert alone.shape == "unimodal" and alone.cluster_share == 0.0
    ref = stall_stats(slow, baseline_ms=1.0)
    assert ref.shape == "stalled" and ref.cluster_share == 1.0
    assert ref.cluster_median_ms == pytest.approx(45.0, abs=1.0)


def test_spread_without_a_gap_is_not_bimodal() -> None:
    rng = random.Random(6)
    samples = [rng.uniform(0.5, 80.0) for _ in range(200)]
    s = stall_stats(samples)
    assert s.cluster_share > 0.05
    assert s.shape == "spread" and not s.bimodal


def test_too_few_samples() -> None:
    rng = random.Random(7)
    s = stall_stats(_fast(5, rng) + _stalled(24, rng))
    assert s.n == 29 and s.too_few and s.shape == "too-few"
    assert not stall_stats([]).has_cluster
    arms = arm_results({"control": {1: _fast(10, rng)}, "suspect": {1: _stalled(10, rng)}})
    v = launched_verdict(arms)
    assert v.outcome == "too few samples"
    assert v.headline.kind == "too_few_launched"
    assert (v.headline.values["suspect_n"], v.headline.values["control_n"]) == (10, 10)


def test_threshold_is_configurable() -> None:
    rng = random.Random(8)
    samples = _fast(100, rng) + [rng.gauss(21.0, 0.3) for _ in range(100)]
    assert stall_stats(samples).cluster_n == 0
    s = stall_stats(samples, threshold_ms=15.0)
    assert s.cluster_share == pytest.approx(0.5) and s.bimodal


def test_sarle_coefficient_known_values() -> None:
    assert sarle_bimodality([1.0, 2.0, 3.0]) is None
    assert sarle_bimodality([2.0] * 10) is None
    two_point = [0.0] * 50 + [1.0] * 50
    assert sarle_bimodality(two_point) > 0.9
    rng = random.Random(9)
    normal = [rng.gauss(0, 1) for _ in range(5000)]
    assert sarle_bimodality(normal) == pytest.approx(1 / 3, abs=0.03)


def _launched(suspect1: list[float], control1: list[float], suspect32: list[float]):
    rng = random.Random(10)
    samples = {
        "control": {1: control1, 32: _fast(200, rng, 5.0)},
        "suspect": {1: suspect1, 32: suspect32},
    }
    labels = {
        "control": "NODELAY on both ends and coalesced writes",
        "suspect": "client NODELAY off and split writes",
    }
    return arm_results(samples, labels)


def _reproduced():
    """99% of the suspect's concurrency-1 requests in a 44 ms cluster, none of the control's."""
    rng = random.Random(11)
    arms = _launched(
        _fast(2, rng) + _stalled(198, rng),
        _fast(200, rng),
        _fast(194, rng, 5.0) + _stalled(6, rng, 48.0),
    )
    return launched_verdict(arms, facts=FACTS)


def test_launched_verdict_reproduced_names_the_numbers() -> None:
    v = _reproduced()
    assert v.outcome == "reproduced"
    assert v.kinds() == ["reproduced", "many_falls", "many_control_clear"]
    head = v.headline.values
    assert head["suspect"].cluster_share == pytest.approx(0.99)
    assert 44.0 <= head["suspect"].cluster_median_ms < 45.0
    assert head["control"].cluster_share == 0.0
    assert head["timer"] == 1  # one delayed-ACK timer
    many = v.finding("many_falls")
    assert many is not None and many.values["share"] == pytest.approx(0.03)
    assert [a.values["name"] for a in v.arms] == ["control", "suspect"]


def test_launched_verdict_in_words() -> None:
    """The words of a reproduced verdict: the numbers and the kernel facts, in one sentence."""
    v = _reproduced()
    assert v.text.startswith(
        "reproduced: with client NODELAY off and split writes, 99% of concurrency-1 requests "
        "wait in a 44."
    )
    assert "the delayed-ACK timer" in v.text and "HZ=250" in v.text
    assert "tcp_pingpong_thresh=1" in v.text
    assert "with NODELAY on both ends and coalesced writes, 0%" in v.text
    assert "at concurrency 32 the cluster falls to 3%" in v.text
    assert len(v.lines) == 2 and v.lines[0].startswith("control (")
    assert v.to_dict()["text"] == v.text and v.to_dict()["headline"]["kind"] == "reproduced"


def test_launched_verdict_does_not_call_queueing_at_high_concurrency_a_stall() -> None:
    # on a busy 2-core machine both arms queue at concurrency 32: the same share "above the
    # fastest decile" in both is not the stall
    rng = random.Random(16)
    queued = [rng.uniform(40.0, 400.0) for _ in range(140)] + _fast(60, rng, 45.0)
    samples = {
        "control": {1: _fast(200, rng), 32: queued},
        "suspect": {1: _fast(2, rng) + _stalled(198, rng), 32: list(queued)},
    }
    v = launched_verdict(arm_results(samples), facts=FACTS)
    assert v.outcome == "reproduced"
    queues = v.finding("many_control_queues")
    assert queues is not None and queues.values["share"] == pytest.approx(0.62, abs=0.01)
    assert "cannot tell a stall from queueing" in v.text


def test_launched_verdict_not_reproduced() -> None:
    rng = random.Random(12)
    arms = _launched(_fast(200, rng), _fast(200, rng), _fast(200, rng, 5.0))
    v = launched_verdict(arms, facts=FACTS)
    assert v.outcome == "not reproduced"
    assert v.headline.kind == "not_reproduced"
    assert v.headline.values["suspect"].cluster_share == 0.0


def test_launched_verdict_partly_when_the_control_stalls_too() -> None:
    rng = random.Random(13)
    arms = _launched(
        _fast(20, rng) + _stalled(180, rng), _fast(100, rng) + _stalled(100, rng),
        _fast(200, rng, 5.0),
    )
    v = launched_verdict(arms, facts=FACTS)
    assert v.outcome == "partly reproduced"


def test_external_verdict_localises_the_stall() -> None:
    rng = random.Random(14)
    samples = {
        "reused": {1: _fast(10, rng) + _stalled(190, rng), 32: _fast(200, rng, 8.0)},
        "fresh-connection": {1: _fast(200, rng, 1.5)},
        "gap-100ms": {1: _fast(3, rng) + _stalled(197, rng)},
        "non-streaming": {1: _fast(200, rng, 30.0)},
    }
    labels = {"gap-100ms": "100 ms idle between requests on one connection"}
    results = arm_results(samples, labels, independent=["non-streaming"])
    v = external_verdict(results, gap_arms=["gap-100ms"], facts=FACTS)
    assert v.outcome == "stall present"
    assert v.kinds() == [
        "stall_present", "traffic_vanishes", "fresh_absent", "nonstream_absent", "gap_persists"
    ]
    head = v.headline.values
    assert head["stats"].cluster_share == pytest.approx(0.95)
    assert head["fast_ref"] == "fresh_median" and head["timer"] == 1
    assert "95% of single-stream requests on one reused connection" in v.text
    assert "idle time does not end it" in v.text


def test_external_verdict_no_stall() -> None:
    rng = random.Random(15)
    samples = {"reused": {1: _fast(200, rng), 32: _fast(200, rng, 8.0)}}
    v = external_verdict(arm_results(samples))
    assert v.outcome == "no stall"
    assert v.kinds() == ["no_stall"]  # no findings about causes without a stall
    assert v.headline.values["stats"].shape == "unimodal"
    assert v.text.startswith("no stall: single-stream TTFT on one reused connection is unimodal")


def test_kernel_facts_read_on_this_machine() -> None:
    facts = kernel_facts()
    assert facts.delack_min_ms == 40.0
    assert "delayed ACK 40 ms" in facts.sentence() or facts.system != "Linux"


def test_external_verdict_reads_a_few_noisy_samples_as_absent_not_present() -> None:
    # 2 of 30 non-streaming requests slowed by a busy machine (7%) against 97% stalled on the
    # reused connection: the stall is absent without streaming, not "present too"
    rng = random.Random(17)
    samples = {
        "reused": {1: _fast(1, rng) + _stalled(29, rng)},
        "fresh-connection": {1: _fast(30, rng)},
        "non-streaming": {1: [*_fast(28, rng, 5.0), 60.0, 75.0]},
    }
    results = arm_results(samples, independent=["non-streaming"])
    assert results["non-streaming"].at(1).cluster_share > 0.05
    v = external_verdict(results)
    assert v.kinds() == ["stall_present", "fresh_absent", "nonstream_absent"]
    nonstream = v.finding("nonstream_absent")
    assert nonstream is not None
    assert nonstream.values["share"] == pytest.approx(2 / 30)
    assert "present when streaming and absent when not (97% vs 7%)" in v.text, v.text
