"""`lab report RUN` rebuilds levels, plots and report.md from requests.parquet alone;
`lab compare` aligns runs and writes overlays."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from lab.analysis.rundir import RequestsWriter
from lab.commands.compare import compare
from lab.commands.report import report

MS = 1_000_000


def synth_run(path: Path, req_s: dict[int, float], mode: str | None = None, seed: int = 0) -> None:
    """A run directory with only requests.parquet (+ config.json when `mode`): closed-loop-like
    records whose throughput per level is about `req_s[c]`."""
    rng = random.Random(seed)
    path.mkdir(parents=True)
    writer = RequestsWriter(path)
    for c, rate in req_s.items():
        latency_ms = 1000.0 * c / rate
        records = []
        for i in range(c + 200):
            sent = int((i // c) * latency_ms * MS) + i
            ttft = latency_ms * 0.2 * (1 + 0.1 * rng.random())
            times = [sent + int((ttft + k * (latency_ms - ttft) / 7) * MS) for k in range(8)]
            ok = i != c + 50
            records.append({
                "run_id": path.name, "concurrency": c, "repeat": 0, "index": i,
                "request_id": f"c{c}-{i}", "warmup": i < c, "ok": ok,
                "error_kind": None if ok else "http_503", "http_status": 200 if ok else 503,
                "scheduled_ns": sent, "sent_ns": sent,
                "first_ns": times[0] if ok else None, "end_ns": times[-1] if ok else None,
                "done_ns": times[-1] + MS, "chunk_times_ns": times if ok else [],
                "chunks": 8 if ok else 0, "output_tokens": 8 if ok else 0,
                "output_tokens_source": "usage", "input_tokens": 16, "cached_tokens": 0,
                "tokens_per_chunk": 1.0 if ok else None,
            })
        writer.append(records)
    if mode:
        roles = ["aggregated"] if mode == "aggregated" else ["prefill", "decode"]
        (path / "config.json").write_text(json.dumps(
            {"topology": {"fleets": [{"role": r, "count": 1} for r in roles]},
             "sweep": {"name": mode}}))


REF = {1: 22.0, 32: 533.5, 128: 1013.6, 256: 1041.7}


def test_report_rebuilds_from_requests_alone(tmp_path: Path) -> None:
    run = tmp_path / "run"
    synth_run(run, REF)
    result = CliRunner().invoke(report, [str(run)])
    assert result.exit_code == 0, result.output
    for name in ("levels.csv", "levels.json", "report.md", "plots/throughput.png",
                 "plots/latency_vs_throughput.png", "plots/ttft.png", "plots/chunk_gaps.png"):
        assert (run / name).exists(), name
    levels = pd.read_csv(run / "levels.csv")
    assert levels["concurrency"].tolist() == [1, 32, 128, 256]
    assert levels["failed"].tolist() == [1, 1, 1, 1]
    assert levels["errors"].tolist() == ["1 (http_503: 1)"] * 4
    assert levels["requests"].tolist() == [200] * 4
    assert levels["warmup"].tolist() == [1, 32, 128, 256]
    assert levels["req_s"].iloc[1] == pytest.approx(533.5, rel=0.2)
    md = (run / "report.md").read_text()
    assert "knee at 128" in md
    assert "| Conc | req/s |" in md and "![" in md
    assert "no procs.parquet" in md
    # rebuilding again gives the same levels: nothing but requests.parquet is read
    (run / "levels.csv").unlink()
    (run / "report.md").unlink()
    assert CliRunner().invoke(report, [str(run), "--no-plots"]).exit_code == 0
    pd.testing.assert_frame_equal(pd.read_csv(run / "levels.csv"), levels)


def test_report_bad_run(tmp_path: Path) -> None:
    result = CliRunner().invoke(report, [str(tmp_path / "missing")])
    assert result.exit_code == 2 and "RUN" in result.output
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(report, [str(tmp_path / "empty")])
    assert result.exit_code == 2 and "requests.parquet" in result.output


def test_compare_runs(tmp_path: Path) -> None:
    synth_run(tmp_path / "a", {1: 22.0, 32: 500.0, 128: 1000.0}, mode="aggregated")
    synth_run(tmp_path / "b", {32: 479.5, 128: 882.0}, mode="disaggregated", seed=1)
    result = CliRunner().invoke(compare, [str(tmp_path / "a"), str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    assert "disaggregated costs" in result.output
    assert "throughput at 32" in result.output and "at 128" in result.output
    out = tmp_path / "a" / "compare"
    for name in ("compare.md", "compare.csv", "throughput.png", "latency_vs_throughput.png",
                 "ttft_cdf.png"):
        assert (out / name).exists(), name
    result = CliRunner().invoke(compare, [str(tmp_path / "a")])
    assert result.exit_code == 2


def test_compare_prints_the_few_columns_a_person_reads(tmp_path: Path) -> None:
    """The terminal gets req/s, TTFT p50, latency p99, ITL and CPU per token, each with its
    delta; compare.md keeps every compared metric."""
    synth_run(tmp_path / "a", {32: 500.0, 128: 1000.0}, mode="aggregated")
    synth_run(tmp_path / "b", {32: 479.5, 128: 882.0}, mode="disaggregated", seed=1)
    result = CliRunner().invoke(compare, [str(tmp_path / "a"), str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    header = next(line for line in result.output.splitlines() if line.startswith("| Conc"))
    names = [c.strip() for c in header.strip("|").split("|")]
    assert names == ["Conc"] + [f"{m} ({run})" if run else "Δ%"
                                for m in ("req/s", "TTFT p50 (ms)", "latency p99 (ms)",
                                          "ITL mean (ms)", "server CPU (us/token)")
                                for run in ("aggregated", "disaggregated", None)]
    full = (tmp_path / "a" / "compare" / "compare.md").read_text()
    assert "out tok/s (aggregated)" in full and "total CPU (us/token) (aggregated)" in full
    assert "compare.html" in result.output


def test_knee_of_a_table_without_figures_is_no_knee() -> None:
    # no level measured anything (or a level table without latency columns): no knee, no KeyError
    import pandas as pd

    from lab.report.build import knee_of

    assert knee_of(pd.DataFrame()).knee is None
    assert knee_of(pd.DataFrame({"concurrency": [1, 2], "req_s": [None, None]})).knee is None


def test_stamps_on_two_clocks_give_no_time_series_and_say_why(tmp_path: Path) -> None:
    """A level whose stamps span days (two clocks mixed, as unanchored shards would be) is not
    binned per second (that took 22 GB once): the report rebuilds and states why there is no
    time series."""
    run = tmp_path / "run"
    synth_run(run, {32: 533.5})
    path = run / "requests.parquet"
    df = pd.read_parquet(path)
    shift = 2 * 86_400 * 1_000_000_000  # two days, in ns
    last = df.index[-1]
    for col in ("scheduled_ns", "sent_ns", "first_ns", "end_ns", "done_ns"):
        df.loc[last, col] = df.loc[last, col] + shift
    df.at[last, "chunk_times_ns"] = [t + shift for t in df.at[last, "chunk_times_ns"]]
    df.to_parquet(path, index=False)
    result = CliRunner().invoke(report, [str(run), "--no-plots"])
    assert result.exit_code == 0, result.output
    assert "not on one clock" in result.output
    assert "not on one clock" in (run / "report.md").read_text()
    assert not (run / "timeline.parquet").exists()
