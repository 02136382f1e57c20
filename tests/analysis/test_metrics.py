"""Metric definitions (docs/metrics.md) on hand-made request records (stamps and counts, as
the client writes them; the millisecond figures derived by lab.analysis.request_times)."""

from __future__ import annotations

import pandas as pd
import pytest

from lab.analysis.metrics import (
    SLOs,
    by_concurrency,
    chunk_gaps_ms,
    level_summary,
    process_figures,
    summarize_run,
)
from lab.analysis.request_times import requests_frame
from lab.analysis.stats import describe

MS = 1_000_000


def rec(i: int, sent_ms: float, chunks_ms: list[float], *, conc: int = 2, tokens: int | None = None,
        ok: bool = True, kind: str | None = None, warmup: bool = False, repeat: int = 0) -> dict:
    times = [int(t * MS) for t in chunks_ms]
    n_tok = tokens if tokens is not None else len(times)
    sent = int(sent_ms * MS)
    return {
        "concurrency": conc, "repeat": repeat, "index": i, "warmup": warmup, "ok": ok,
        "error_kind": kind, "sent_ns": sent, "scheduled_ns": sent - MS // 2,
        "first_ns": times[0] if times else None, "end_ns": times[-1] if times else None,
        "done_ns": (times[-1] if times else sent) + MS,
        "chunk_times_ns": times, "chunks": len(times), "output_tokens": n_tok,
        "output_tokens_source": "usage", "input_tokens": 10, "cached_tokens": 0,
    }


def frame() -> pd.DataFrame:
    return requests_frame([
        rec(0, 0, [5, 6, 7], warmup=True),              # warm-up: excluded
        rec(1, 10, [20, 22, 26]),                      # ttft 10, latency 16, itl 3
        rec(2, 12, [16, 17, 18, 30], tokens=8),        # ttft 4, latency 18, itl 14/7 = 2
        rec(3, 14, [], ok=False, kind="http_503"),      # failed, no chunks, done at 15
        rec(4, 20, [24, 40], ok=False, kind="stream_error"),
    ])


def test_definitions() -> None:
    row = level_summary(frame())
    assert row["requests"] == 4 and row["ok"] == 2 and row["failed"] == 2 and row["warmup"] == 1
    assert row["error_rate"] == 0.5
    assert row["errors"] == "2 (http_503: 1, stream_error: 1)"
    # measured duration: first measured request sent (10 ms) -> last response (40 ms)
    assert row["duration_s"] == pytest.approx(0.030)
    assert row["req_s"] == pytest.approx(2 / 0.030)
    assert row["out_tok_s"] == pytest.approx((3 + 8) / 0.030)
    assert row["ttft_ms_avg"] == pytest.approx(7.0)
    assert row["ttft_ms_min"] == pytest.approx(4.0) and row["ttft_ms_max"] == pytest.approx(10.0)
    assert row["latency_ms_avg"] == pytest.approx(17.0)
    assert row["itl_ms_avg"] == pytest.approx((3 + 2) / 2)
    assert row["ttst_ms_avg"] == pytest.approx((2 + 1) / 2)
    assert row["send_delay_ms_p99"] == pytest.approx(0.5)
    assert row["tokens_per_chunk"] == pytest.approx(11 / 7)
    # gaps pooled over successful requests: 2, 4, 1, 1, 12
    assert row["gap_ms_max"] == pytest.approx(12.0)
    assert row["gap_ms_p50"] == pytest.approx(2.0)


def test_request_times_derived_from_the_stamps() -> None:
    df = frame().set_index("index")
    assert df.loc[1, "ttft_ms"] == 10 and df.loc[1, "latency_ms"] == 16
    assert df.loc[1, "ttst_ms"] == 2 and df.loc[1, "itl_ms"] == 3
    assert df.loc[2, "itl_ms"] == pytest.approx(14 / 7)  # usage says 8 tokens in 4 chunks
    assert df["send_delay_ms"].tolist() == [0.5] * 5
    assert df.loc[3, ["ttft_ms", "ttst_ms", "latency_ms", "itl_ms"]].isna().all()  # no chunks
    one = requests_frame([rec(0, 0, [5], tokens=1)])
    assert one["ttft_ms"].iloc[0] == 5 and one[["ttst_ms", "itl_ms"]].isna().all(axis=None)


def test_exact_percentiles() -> None:
    d = describe(range(1, 101))
    assert d["p50"] == pytest.approx(50.5) and d["p99"] == pytest.approx(99.01)
    assert d["min"] == 1 and d["max"] == 100 and d["avg"] == pytest.approx(50.5)
    assert describe([])["p99"] is None


def test_gaps_pooled() -> None:
    df = requests_frame([rec(0, 0, [1, 2, 4]), rec(1, 0, [3, 7])])
    assert sorted(chunk_gaps_ms(df)) == pytest.approx([1, 2, 4])


def test_goodput() -> None:
    row = level_summary(frame(), slos=SLOs(ttft_ms=5))
    assert row["goodput_req_s"] == pytest.approx(1 / 0.030)


def test_server_cpu_over_the_window() -> None:
    procs = pd.DataFrame([
        {"t_ns": t * MS, "name": name, "role": "x", "pid": 1, "cpu_pct": cpu, "rss_bytes": rss}
        for t, name, cpu, rss in [(0, "engine-0", 999, 1e6), (15, "engine-0", 50, 2e6),
                                  (30, "engine-0", 70, 3e6), (45, "engine-0", 60, 4e6),
                                  (90, "engine-0", 999, 9e6)]
    ])
    row = level_summary(frame(), procs=procs)
    # window (10, 40]: the samples at 15, 30 and 45 cover (0, 15], (15, 30] and (30, 45], of
    # which 5, 15 and 10 ms lie in the window; the one at 90 covers (45, 90], none of it
    assert row["cpu_pct:engine-0"] == pytest.approx((5 * 50 + 15 * 70 + 10 * 60) / 30)
    assert row["rss_peak_mb:engine-0"] == pytest.approx(4.0)


def samples(pid: int, at_ms: list[tuple[float, float]]) -> list[dict]:
    return [{"t_ns": int(t * MS), "name": "frontend", "role": "frontend", "pid": pid,
             "cpu_pct": cpu, "rss_bytes": 1e6} for t, cpu in at_ms]


@pytest.mark.parametrize("phase_ms", [0.0, 80.0, 250.0, 420.0])
def test_server_cpu_does_not_depend_on_the_sampling_phase(phase_ms: float) -> None:
    """A process at 80% of a core until a 1.2 s level ends and idle after it, sampled every
    500 ms from some phase, plus the sample the sweep takes as the level ends and the
    sampler's next tick (idle, 0%): 80% whatever the phase, since the idle tick's interval
    lies after the window."""
    start, end = 1000.0, 2200.0
    ticks = [t for t in (phase_ms + 500 * k for k in range(8)) if t < end]
    after = ticks[-1] + 500
    rows = [(t, 80.0) for t in ticks] + [(end, 80.0), (after, 0.0)]
    figures = process_figures(pd.DataFrame(samples(7, rows)), int(start * MS), int(end * MS),
                              1.2, ok=1)
    assert figures["cpu_pct:frontend"] == pytest.approx(80.0)


def test_a_restarted_process_counts_its_new_pid_from_its_own_samples() -> None:
    """A process restarted mid-level (same name, new pid): the new pid's first sample covers
    one usual interval, not the time since the old pid's last sample."""
    rows = samples(1, [(0, 10.0), (500, 10.0), (1000, 10.0)]) + samples(
        2, [(1900, 90.0), (2400, 90.0), (2900, 90.0)])
    figures = process_figures(pd.DataFrame(rows), 0, 2900 * MS, 2.9, ok=1)
    # pid 1 covers (0, 1000] at 10% (its first sample's interval lies before the window);
    # pid 2 covers (1400, 2900] at 90%
    assert figures["cpu_pct:frontend"] == pytest.approx((1000 * 10 + 1500 * 90) / 2500)


def test_client_and_total_cpu_per_output_token() -> None:
    """The client's CPU covers every request of the level (warm-up too): per token of all its
    successful requests (3 warm-up + 3 + 8); the total adds the server's per-token figure."""
    procs = pd.DataFrame([
        {"t_ns": t * MS, "name": "engine-0", "role": "x", "pid": 1, "cpu_pct": 50.0,
         "rss_bytes": 1e6} for t in (0, 15, 30, 45)
    ])
    row = level_summary(frame(), procs=procs, client={"cpu_s": 0.014})
    assert row["client_cpu_us_per_token"] == pytest.approx(1e6 * 0.014 / 14)
    # server: 50% of a core over the 30 ms window, per the window's 11 output tokens
    assert row["server_cpu_us_per_token"] == pytest.approx(1e6 * 0.5 * 0.030 / 11)
    assert row["total_cpu_us_per_token"] == pytest.approx(
        row["client_cpu_us_per_token"] + row["server_cpu_us_per_token"])
    # without the client's figures (an older run): none, not a server-only "total"
    bare = level_summary(frame(), procs=procs)
    assert bare["client_cpu_us_per_token"] is None and bare["total_cpu_us_per_token"] is None


def test_levels_and_repeats() -> None:
    df = pd.concat([frame(), frame().assign(concurrency=4),
                    frame().assign(repeat=1)], ignore_index=True)
    levels = summarize_run(df)
    assert list(zip(levels["concurrency"], levels["repeat"], strict=True)) == [(2, 0), (2, 1),
                                                                                (4, 0)]
    table = by_concurrency(levels)
    assert list(table["concurrency"]) == [2, 4]
    assert table.loc[0, "repeats"] == 2 and table.loc[0, "failed"] == 4
    assert table.loc[0, "errors"] == "4 (http_503: 2, stream_error: 2)"


def test_server_cpu_wait_over_the_window_and_summed() -> None:
    """cpu_wait_pct (launch.sampler's run-queue wait) is weighted over the window as cpu_pct
    is, per process, and summed into server_cpu_wait_pct; a run without the column has none."""
    procs = pd.DataFrame([
        {"t_ns": t * MS, "name": name, "role": "x", "pid": pid, "cpu_pct": 50.0,
         "cpu_wait_pct": wait, "rss_bytes": 1e6}
        for t, name, pid, wait in [(0, "engine", 1, 999), (15, "engine", 1, 20),
                                   (30, "engine", 1, 40), (45, "engine", 1, 10),
                                   (0, "frontend", 2, 999), (45, "frontend", 2, 5)]
    ])
    row = level_summary(frame(), procs=procs)
    assert row["cpu_wait_pct:engine"] == pytest.approx((5 * 20 + 15 * 40 + 10 * 10) / 30)
    assert row["cpu_wait_pct:frontend"] == pytest.approx(5)
    assert row["server_cpu_wait_pct"] == pytest.approx(row["cpu_wait_pct:engine"] + 5)
    old = level_summary(frame(), procs=procs.drop(columns=["cpu_wait_pct"]))
    assert "server_cpu_wait_pct" not in old and "cpu_wait_pct:engine" not in old
