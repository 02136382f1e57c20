"""Runs aligned by concurrency, deltas in percent, and the sentence."""

from __future__ import annotations

import pandas as pd
import pytest

from lab.analysis.compare import RunData, align, compare_sentences, run_labels


def levels(req_s: dict[int, float]) -> pd.DataFrame:
    return pd.DataFrame([{"concurrency": c, "req_s": v, "out_tok_s": v * 128,
                          "latency_ms_avg": 1000 * c / v, "latency_ms_p99": 2000 * c / v,
                          "ttft_ms_avg": 1.0, "ttft_ms_p99": 2.0} for c, v in req_s.items()])


AGG = {"topology": {"fleets": [{"role": "aggregated", "count": 1}]}}
DIS = {"topology": {"fleets": [{"role": "prefill"}, {"role": "decode"}]}}


def test_disagg_sentence() -> None:
    labels = run_labels([("a", AGG), ("b", DIS)])
    assert labels == ["aggregated", "disaggregated"]
    a = RunData(labels[0], None, levels({1: 20.0, 32: 500.0, 128: 1000.0}), config=AGG)
    b = RunData(labels[1], None, levels({32: 479.5, 128: 882.0, 256: 900.0}), config=DIS)
    aligned = align([a, b])
    assert list(aligned["concurrency"]) == [32, 128]
    assert aligned["req_s|disaggregated|delta_pct"].tolist() == pytest.approx([-4.1, -11.8])
    assert compare_sentences([a, b], aligned) == [
        "disaggregated costs 4.1% throughput at 32, 11.8% at 128"]


def test_mixed_and_named_runs() -> None:
    labels = run_labels([("base", None), ("tuned", None)])
    assert labels == ["base", "tuned"]
    a = RunData("base", None, levels({1: 10.0, 2: 20.0}))
    b = RunData("tuned", None, levels({1: 11.0, 2: 19.0}))
    (sentence,) = compare_sentences([a, b], align([a, b]))
    assert sentence == "tuned (vs base) costs 5.0% throughput at 2 and gains 10.0% throughput at 1"


def test_nothing_shared() -> None:
    a = RunData("a", None, levels({1: 10.0}))
    b = RunData("b", None, levels({2: 10.0}))
    (sentence,) = compare_sentences([a, b], align([a, b]))
    assert "share no concurrency" in sentence
