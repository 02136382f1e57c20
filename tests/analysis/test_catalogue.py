"""The metric catalogue (lab/analysis/catalogue.py): levels.csv keeps its column names, the views
read their columns and headings from it, `lab compare` judges deltas by its better direction,
and docs/metrics.md's table is the catalogue row by row."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from lab.analysis import catalogue as cat
from lab.analysis.catalogue import CATALOGUE, Metric, catalogue_markdown
from lab.analysis.compare import RunData, align, table_rows
from lab.analysis.metrics import SLOs, level_summary
from lab.analysis.request_times import requests_frame
from lab.fidelity.gaps import METRICS
from lab.report.markdown import results_rows
from tests.analysis.test_metrics import MS, frame
from tests.open_loop.test_open_loop_analysis import rows as open_loop_rows

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"

#: levels.csv's metric columns as users' scripts read them: renaming one breaks those scripts.
LEVELS_CSV_METRIC_COLUMNS = {
    "error_rate", "duration_s", "req_s", "out_tok_s", "tokens_per_chunk",
    *(f"ttft_ms_{s}" for s in ("avg", "std", "min", "p50", "p90", "p95", "p99", "max")),
    "ttst_ms_avg", "ttst_ms_p50", "ttst_ms_p99",
    *(f"latency_ms_{s}" for s in ("avg", "std", "min", "p50", "p90", "p95", "p99", "max")),
    "itl_ms_avg", "itl_ms_p50", "itl_ms_p99",
    "gap_ms_avg", "gap_ms_p50", "gap_ms_p99", "gap_ms_max",
    "send_delay_ms_p50", "send_delay_ms_p99", "send_delay_ms_max", "ttfr_ms_p50", "ttfr_ms_p99",
    "ttfo_ms_p50", "ttfo_ms_p99", "reasoning_chunks_mean", "answer_chunks_mean", "slo_good",
    "slo_share", "slo_share_lo", "slo_share_hi", "goodput_req_s",
    "schedule_req_s", "sent_req_s", "completed_req_s", "sent_fraction",
    "dispatch_lag_ms_p50", "dispatch_lag_ms_p99", "dispatch_lag_ms_max", "held", "held_ms_p99",
    "held_ms_max", "latency_growth_first_ms", "latency_growth_last_ms", "sustained",
    *(f"ttft_intended_ms_{s}" for s in ("avg", "p50", "p90", "p99", "max")),
    *(f"latency_intended_ms_{s}" for s in ("avg", "p50", "p90", "p99", "max")),
    "client_procs", "client_cpu_pct", "client_cpu_pct_max_proc", "client_cpu_ms_per_req",
    "loop_lag_p99_ms", "loop_lag_max_ms", "server_cpu_pct", "server_cpu_wait_pct",
    "server_cpu_ms_per_req",
    "server_cpu_us_per_token", "client_cpu_us_per_token", "total_cpu_us_per_token",
}


def _names(open_loop: bool) -> set[str]:
    return {c.name for m in CATALOGUE.values() if m.open_loop == open_loop for c in m.columns()}


def test_levels_csv_has_every_catalogue_column_under_its_old_name() -> None:
    """The catalogue generates levels.csv's names unchanged, and a level's row has every one of
    them: a closed-loop level the closed-loop metrics, an open-loop level all of them."""
    assert _names(False) | _names(True) == LEVELS_CSV_METRIC_COLUMNS
    def procs(ms: range) -> pd.DataFrame:  # an engine at 50% sampled over `ms`
        return pd.DataFrame([{"t_ns": t * MS, "name": "engine-0", "role": "x", "pid": 1,
                              "cpu_pct": 50.0, "cpu_wait_pct": 5.0, "rss_bytes": 1e6}
                             for t in ms])

    client = {"cpu_s": 0.01, "procs": 1, "cpu_pct": 3.0, "cpu_pct_max_proc": 3.0,
              "cpu_ms_per_request": 1.0, "loop_lag_p99_ms": 1.0, "loop_lag_max_ms": 2.0}
    closed = level_summary(frame(), procs=procs(range(0, 60, 15)), client=client,
                           slos=SLOs(ttft_ms=5))
    assert _names(False) <= set(closed) and not _names(True) & set(closed)
    opened = level_summary(requests_frame(open_loop_rows(10.0, 30)),
                           procs=procs(range(9_000, 14_000, 500)), client=client,
                           slos=SLOs(ttft_ms=5))
    assert _names(False) | _names(True) <= set(opened)
    assert closed["client_cpu_ms_per_req"] == 1.0 and opened["held"] == 0  # client.json's keys


def test_a_metric_has_only_the_statistics_it_keeps() -> None:
    assert cat.TTFT.col("p50").name == "ttft_ms_p50" and cat.REQ_S.col().name == "req_s"
    with pytest.raises(KeyError, match=r"ttst_ms has no statistic 'p90'.*avg, p50, p99"):
        cat.TTST.col("p90")
    with pytest.raises(KeyError, match="req_s has no statistic 'p50'"):
        cat.REQ_S.col("p50")
    with pytest.raises(KeyError, match="ttft_ms has no statistic None"):
        cat.TTFT.col()
    with pytest.raises(ValueError, match=r"unknown statistics \['p42'\]"):
        Metric("x_ms", "x", "ms", "x", "x", stats=("p42",))
    with pytest.raises(KeyError, match="no metric 'ttft'"):
        cat.metric("ttft")


def test_every_view_heads_a_column_with_its_catalogue_heading() -> None:
    """The report, `lab compare` and `lab fidelity` name TTFT p50 alike, from the catalogue."""
    heading = cat.TTFT.col("p50").heading
    assert heading == "TTFT p50 (ms)"
    assert dict(METRICS)["ttft_ms_p50"] == heading
    levels = pd.DataFrame([{"concurrency": 8, "req_s": 100.0, "ttft_ms_avg": 2.0,
                            "ttft_ms_p50": 1.5, "ttft_ms_p99": 9.0, "errors": "0"}])
    header, rows = results_rows(levels)
    # a statistic after another of the same metric is named by the statistic alone
    i = header.index("TTFT mean (ms)")
    assert header[i + 1:i + 3] == ["p50", "p99"] and rows[0][i:i + 3] == ["2.00", "1.50", "9.00"]
    a, b = RunData("a", None, levels), RunData("b", None, levels)
    compare_header, _ = table_rows([a, b], align([a, b]))
    assert f"{heading} (a)" in compare_header and "req/s (b)" in compare_header


def test_compare_says_whether_a_delta_is_better_or_worse() -> None:
    """More throughput is better, more latency worse; tok/chunk has no better direction, and
    a negligible change is no change."""
    def run(label: str, req_s: float, latency: float, tpc: float) -> RunData:
        return RunData(label, None, pd.DataFrame([{
            "concurrency": 8, "req_s": req_s, "latency_ms_avg": latency,
            "tokens_per_chunk": tpc, "ttft_ms_p50": 1.0}]))

    a, b = run("a", 100.0, 10.0, 1.0), run("b", 110.0, 11.0, 2.0)
    header, rows = table_rows([a, b], align([a, b]))
    cells = dict(zip(header, rows[0], strict=True))

    def delta(heading: str) -> str:
        return rows[0][header.index(f"{heading} (b)") + 1]

    assert delta("req/s") == "+10.0% better"
    assert delta("latency mean (ms)") == "+10.0% worse"
    assert delta("tok/chunk") == "+100.0%"
    assert delta("TTFT p50 (ms)") == "+0.0%"
    assert cells["req/s (a)"] == "100.0"


def test_the_docs_table_is_the_catalogue_row_by_row() -> None:
    """docs/metrics.md "The metric catalogue" holds catalogue_markdown()'s table; when a metric
    is added or changed, paste the output of `python -m lab.analysis.catalogue` there."""
    expected = catalogue_markdown().splitlines()
    lines = DOC.read_text(encoding="utf-8").splitlines()
    assert expected[0] in lines, f"docs/metrics.md lacks the catalogue's table: {expected[0]}"
    start = lines.index(expected[0])
    documented = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        documented.append(line)
    for n, (want, have) in enumerate(zip(expected, documented, strict=False)):
        assert have == want, f"docs/metrics.md catalogue row {n}:\n  docs:      {have}\n" \
                             f"  catalogue: {want}\n(python -m lab.analysis.catalogue prints it)"
    assert len(documented) == len(expected), (
        f"docs/metrics.md's catalogue table has {len(documented) - 2} metrics, the catalogue "
        f"{len(expected) - 2} (python -m lab.analysis.catalogue prints the table)")
