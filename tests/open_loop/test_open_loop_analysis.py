"""The open-loop analysis from requests.parquet-shaped rows: the level figures and their
sentences, the per-second timeline, the recovery after a fault, and `lab compare` by rate."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from lab.analysis import rundir
from lab.analysis.metrics import summarize_run
from lab.analysis.request_times import requests_frame
from lab.analysis.timeline import recovery, run_timeline
from lab.open_loop.figures import schedule_sentence, sustained_sentence
from lab.report.comparison import compare_runs

S = 1_000_000_000
MS = 1_000_000


def rows(rate: float, n: int, *, lag_ms: float = 0.05, ttft_ms: float = 10.0,
         stall: tuple[float, float] | None = None, held_ms: float = 0.0,
         t0: int = 10 * S) -> list[dict]:
    """n requests of a constant schedule; with `stall` = (from_s, to_s), requests sent in it get
    their first token only at its end."""
    out = []
    for i in range(n):
        intended = t0 + int(i * S / rate)
        scheduled = intended + int(held_ms * MS)
        sent = scheduled + int(lag_ms * MS)
        first = sent + int(ttft_ms * MS)
        if stall and t0 + stall[0] * S <= sent < t0 + stall[1] * S:
            first = t0 + int(stall[1] * S) + int(ttft_ms * MS)
        end = first + 4 * MS
        out.append(dict(run_id="r", concurrency=0, rate=rate, repeat=0, index=i, warmup=False,
                        ok=True, intended_ns=intended, scheduled_ns=scheduled, sent_ns=sent,
                        first_ns=first, end_ns=end, done_ns=end + 100_000,
                        chunk_times_ns=[first, first + 2 * MS, end], output_tokens=3, chunks=3,
                        input_tokens=8, cached_tokens=None, output_tokens_source="usage",
                        input_tokens_source="usage", error_kind=None))
    return out


def test_level_figures_and_the_schedule_sentence() -> None:
    kept = requests_frame(rows(50.0, 200))
    late = requests_frame(rows(100.0, 200, lag_ms=3.0))
    levels = summarize_run(pd.concat([kept, late], ignore_index=True))
    assert list(levels["rate"]) == [50.0, 100.0]
    a, b = levels.iloc[0], levels.iloc[1]
    assert abs(a["schedule_req_s"] - 50.0) < 0.01 and abs(a["sent_req_s"] - 50.0) < 0.01
    assert abs(b["dispatch_lag_ms_p99"] - 3.0) < 0.01
    assert a["ttft_intended_ms_p50"] >= a["ttft_ms_p50"]
    text = schedule_sentence(levels)
    assert "rate=100/s: dispatch lag p99 3.00 ms" in text and "rate=50/s" not in text
    assert "highest sustained rate is 100 req/s" in sustained_sentence(levels)


def test_held_requests_are_said_to_be_the_caps() -> None:
    levels = summarize_run(requests_frame(rows(50.0, 100, held_ms=30.0)))
    r = levels.iloc[0]
    assert r["held"] == 100 and abs(r["held_ms_max"] - 30.0) < 0.01
    assert abs(r["ttft_intended_ms_p50"] - r["ttft_ms_p50"] - 30.05) < 0.01
    assert "--max-concurrency held requests" in schedule_sentence(levels)


def test_growing_latency_is_not_sustained() -> None:
    recs = rows(50.0, 300)
    for i, r in enumerate(recs):  # a queue building up: each request waits 0.1 ms more
        r["first_ns"] += i * MS // 10
        r["end_ns"] += i * MS // 10
        r["done_ns"] += i * MS // 10
    levels = summarize_run(requests_frame(recs))
    # the completed rate still keeps up (within 2%): only the growth says it is not sustained
    assert levels.iloc[0]["completed_req_s"] >= 0.98 * levels.iloc[0]["schedule_req_s"]
    assert levels.iloc[0]["sustained"] == 0
    assert "no rate of the sweep was sustained" in sustained_sentence(levels)


def test_timeline_counts_every_request_and_recovery_after_a_stall() -> None:
    recs = rows(20.0, 200, stall=(3.0, 5.0))  # 10 s of arrivals, stalled from 3 s to 5 s
    df = requests_frame(recs)
    tl = run_timeline(df)
    assert int(tl["sent"].sum()) == 200 and int(tl["intended"].sum()) == 200
    assert int(tl["completed"].sum()) == 200
    during = tl[(tl["t_s"] >= 3) & (tl["t_s"] < 5)]
    assert (during["sent"] == 20).all() and (during["completed"] == 0).all()
    assert during["in_flight"].iloc[-1] >= 39
    assert (during["ttft_ms_p99"] > 500).all()
    rec = recovery(df, tl, 10 * S + 3 * S, "freeze engine-0")
    assert abs(rec.baseline_ms - 10.05) < 0.1
    assert rec.recovered_s is not None and rec.recovered_s - rec.fault_s == 2.0
    assert "came back within 10%" in rec.sentence() and "2 s after it" in rec.sentence()
    calm = recovery(requests_frame(rows(20.0, 100)), run_timeline(requests_frame(rows(20.0, 100))),
                    10 * S + 2 * S, "kill x")
    assert calm.disturbed_s is None and "stayed within 10%" in calm.sentence()


def _run_dir(path: Path, recs: list[dict]) -> Path:
    path.mkdir()
    rundir.RequestsWriter(path).append(recs)
    rundir.write_json(path / rundir.CONFIG, {"sweep": {"name": path.name, "rates": [20.0]}})
    return path


def test_compare_aligns_open_loop_runs_by_rate(tmp_path: Path) -> None:
    a = _run_dir(tmp_path / "a", rows(20.0, 50) + rows(40.0, 50, t0=20 * S))
    b = _run_dir(tmp_path / "b", rows(20.0, 50, ttft_ms=20.0) + rows(40.0, 50, t0=20 * S))
    result = compare_runs([a, b], tmp_path / "cmp", make_plots=False)
    assert "| Rate |" in result.text and "| 20/s |" in result.text and "| 40/s |" in result.text
    assert "TTFT (intended) p99 (ms) (a)" in result.text
    aligned = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    assert list(aligned["rate"]) == [20.0, 40.0]
    assert np.isclose(aligned.loc[0, "ttft_ms_p50|b|delta_pct"], 100.0)  # 10 ms -> 20 ms
    assert np.isclose(aligned.loc[1, "ttft_ms_p50|b|delta_pct"], 0.0)
