"""End to end on the real serving path: `lab sweep` launching the stack, and `lab sweep --target`
against a frontend started separately. Checks the run directory and the numbers' consistency."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from lab.analysis.rundir import read_requests
from tests.in_process import lab
from tests.procs import Proc, frontend_argv, mocker_argv, sidecar_argv

OSL = 16
ISL = 24
REQUESTS = 20


def same(ms: pd.Series, ns: pd.Series) -> bool:
    """Milliseconds equal to nanoseconds, to the nanosecond."""
    return bool(np.allclose(ms, ns / 1e6, rtol=0, atol=1e-6))


def check_requests(run: Path, concs: list[int]) -> pd.DataFrame:
    """The run's requests: checked, and returned with the derived figures."""
    stored = pd.read_parquet(run / "requests.parquet")
    # the client stores ns stamps and counts; no per-request millisecond figure is stored
    assert not [c for c in stored.columns if c.endswith("_ms")], list(stored.columns)
    req = read_requests(run)
    # request counts per level: warm-up (= concurrency by default) + measured
    assert req.groupby("concurrency").size().to_dict() == {c: c + REQUESTS for c in concs}
    assert (~req["warmup"]).groupby(req["concurrency"]).sum().to_dict() == {
        c: REQUESTS for c in concs}
    assert req["ok"].all(), req.loc[~req["ok"], ["error_kind", "error_message"]]
    # tokens: exactly OSL out, ISL in, as the server's usage says; chunks carry all of them
    assert (req["output_tokens"] == OSL).all() and (req["output_tokens_source"] == "usage").all()
    assert (req["input_tokens"] == ISL).all()
    assert (req["chunks"] >= 1).all() and (req["chunks"] <= OSL).all()
    assert np.allclose(req["tokens_per_chunk"] * req["chunks"], OSL)
    # timestamp ordering, and the per-request metrics agree with the stamps
    assert (req["scheduled_ns"] <= req["sent_ns"]).all()
    assert (req["sent_ns"] < req["first_ns"]).all()
    assert (req["first_ns"] <= req["end_ns"]).all() and (req["end_ns"] <= req["done_ns"]).all()
    for times, n in zip(req["chunk_times_ns"], req["chunks"], strict=True):
        assert len(times) == n and list(times) == sorted(times)
    # the derived figures are the stamps' differences (sent -> first / last content chunk), to
    # the nanosecond
    first = np.array([times[0] for times in req["chunk_times_ns"]])
    last = np.array([times[-1] for times in req["chunk_times_ns"]])
    assert same(req["ttft_ms"], first - stored["sent_ns"])
    assert same(req["latency_ms"], last - stored["sent_ns"])
    assert same(req["send_delay_ms"], stored["sent_ns"] - stored["scheduled_ns"])
    assert req["decode_worker_id"].notna().all()
    assert req["request_id"].is_unique
    return req


def check_levels(run: Path, req: pd.DataFrame, concs: list[int]) -> pd.DataFrame:
    levels = pd.read_csv(run / "levels.csv")
    assert levels["concurrency"].tolist() == concs
    assert levels["requests"].tolist() == [REQUESTS] * len(concs)
    assert levels["ok"].tolist() == [REQUESTS] * len(concs)
    assert (levels["output_tokens"] == REQUESTS * OSL).all()
    assert (levels["req_s"] > 0).all()
    assert np.allclose(levels["out_tok_s"], levels["req_s"] * OSL)
    assert json.loads((run / "levels.json").read_text())[0]["concurrency"] == concs[0]
    return levels


def test_launched_sweep(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = lab("sweep", "--conc", "1,4", "--requests",
               str(REQUESTS), "--osl", str(OSL), "--isl", str(ISL), "--out", str(run), "--quiet")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| Conc |" in proc.stdout and "knee" in proc.stdout
    for name in ("config.json", "requests.parquet", "levels.csv", "levels.json", "client.json",
                 "procs.parquet", "report.md", "events.jsonl", "plots/throughput.png",
                 "plots/latency_vs_throughput.png", "plots/ttft.png", "plots/chunk_gaps.png",
                 "plots/server_cpu.png", "logs/frontend.log", "logs/engine-0.log",
                 "logs/sidecar-0.log"):
        assert (run / name).exists(), name
    config = json.loads((run / "config.json").read_text())
    assert config["sweep"]["concurrency"] == [1, 4] and config["topology"]["fleets"]
    assert config["machine"]["cpu_count"] >= 1 and "versions" in config
    req = check_requests(run, [1, 4])
    assert (req["decode_worker_id"] == "sidecar-0").all()
    levels = check_levels(run, req, [1, 4])
    for name in ("frontend", "sidecar-0", "engine-0"):
        assert f"cpu_pct:{name}" in levels and f"rss_peak_mb:{name}" in levels
    assert (levels["client_cpu_pct"] > 0).all()
    md = (run / "report.md").read_text()
    assert "## Server CPU" in md and "engine-0 CPU %" in md


def test_target_sweep_against_a_separate_frontend(spawn: Callable[..., Proc],
                                                  tmp_path: Path) -> None:
    disc = str(tmp_path / "disc")
    engine = spawn(
        "engine", mocker_argv(role="aggregated", instance_id="engine-x-0001", speedup=1000.0)
    )
    spawn("sidecar", sidecar_argv(engine.address, disc, "sidecar-x"))
    fe = spawn("frontend", frontend_argv(disc, "--expect", "aggregated=1"))
    run = tmp_path / "run"
    proc = lab("sweep", "--target", f"http://{fe.address}", "--model", "mocker-model",
               "--conc", "1,4", "--requests", str(REQUESTS), "--osl", str(OSL), "--isl", str(ISL),
               "--out", str(run), "--quiet", "--no-plots")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    req = check_requests(run, [1, 4])
    assert (req["decode_worker_id"] == "sidecar-x").all()
    check_levels(run, req, [1, 4])
    assert not (run / "procs.parquet").exists()
    assert "server CPU is absent" in (run / "report.md").read_text()
    bad = lab("sweep", "--target", f"http://{fe.address}", "--model", "other-model",
              "--out", str(tmp_path / "bad"))
    assert bad.returncode == 2 and "--model" in bad.stderr and "mocker-model" in bad.stderr
