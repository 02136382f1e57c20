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


def test_the_whole_machines_cpu_per_token_is_compared() -> None:
    """Client and total (server + client) CPU per output token are compared like the server's."""
    from lab.analysis.compare import table_rows

    def run(label: str, server: float, client: float) -> RunData:
        lv = levels({32: 300.0}).assign(server_cpu_us_per_token=server,
                                         client_cpu_us_per_token=client,
                                         total_cpu_us_per_token=server + client)
        return RunData(label, None, lv)

    a, b = run("lab", 30.0, 6.0), run("dynamo", 30.0, 8.0)
    aligned = align([a, b])
    assert aligned["client_cpu_us_per_token|dynamo|delta_pct"].tolist() == pytest.approx([33.3],
                                                                                      abs=0.1)
    assert aligned["total_cpu_us_per_token|dynamo|delta_pct"].tolist() == pytest.approx([5.6],
                                                                                     abs=0.1)
    header, rows = table_rows([a, b], aligned)
    i = header.index("client CPU (us/token) (lab)")
    assert rows[0][i:i + 3] == ["6.00", "8.00", "+33.3% worse"]
    j = header.index("total CPU (us/token) (lab)")
    assert rows[0][j:j + 3] == ["36.00", "38.00", "+5.6% worse"]
