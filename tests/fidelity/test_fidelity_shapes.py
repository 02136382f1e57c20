"""`lab fidelity` on every load shape, over real processes: open-loop rates, a trace replay and
the held-out suite, against a target that is a lab stack on the known curve (the lab side runs
the same engine args, so its gaps are the two runs' noise)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pandas as pd
import psutil
import pytest
from click.testing import CliRunner

from lab.commands.fidelity import fidelity
from lab.fidelity.gaps import METRICS
from lab.fidelity.suite import SUITE
from lab.load.trace import write_trace
from lab.load.trace_synth import SynthSpec, synth_trace
from launch.events import read_events
from tests.fidelity.conftest import LAB, ROOT, lab, lab_stack
from tests.waiting import wait_until

T = TypeVar("T")

COMMON = ("--prompt-kind", "token_ids", "--no-plots", "--in-process-client")
#: the suite's target and lab run 20x faster than real time: its ISL 2048 levels take seconds.
#: Faster still, a late wake-up of a ms or two grows to a tenth of the shortest TTFTs
SUITE_SPEEDUP = "20"


@pytest.fixture(scope="module")
def fast_target(tmp_path_factory: pytest.TempPathFactory,
                true_engine_args: Path) -> Iterator[str]:
    """The known curve at --speedup SUITE_SPEEDUP."""
    yield from lab_stack(tmp_path_factory.mktemp("fast-target"), true_engine_args,
                         speedup=SUITE_SPEEDUP)


def _levels(path: Path) -> pd.DataFrame:
    return pd.read_csv(path / "levels.csv")


def _value(levels: pd.DataFrame, rate: float, metric: str) -> float:
    row = levels[levels["rate"].round(6) == round(rate, 6)]
    assert len(row) == 1, levels
    return float(row[metric].iloc[0])


def test_fidelity_rate_levels_line_up_by_offered_rate(
        true_target: str, true_engine_args: Path, tmp_path: Path) -> None:
    """--rate: each open-loop level of the target against the lab's at the same offered rate,
    for the lab and a second engine-args file shown beside (--also-engine-args)."""
    out = tmp_path / "fid"
    proc = lab("fidelity", "--target", true_target, "--engine-args", str(true_engine_args),
               "--also-engine-args", f"twin={true_engine_args}", "--rate", "8,16",
               "--arrival", "constant", "--requests", "8", "--isl", "64", "--osl", "8",
               *COMMON, "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rate=16/s:" in proc.stderr  # progress, per level
    gaps = json.loads((out / "fidelity.json").read_text())["gaps"]
    levels = {side: _levels(out / side) for side in ("target", "lab", "twin")}
    assert set(gaps) == {"lab", "twin"}
    for side in ("lab", "twin"):
        assert {(g["rate"], g["metric"]) for g in gaps[side]} == {
            (r, m) for r in (8.0, 16.0) for m, _ in METRICS}
        for g in gaps[side]:
            t = _value(levels["target"], g["rate"], g["metric"])
            x = _value(levels[side], g["rate"], g["metric"])
            assert g["target"] == t and g["lab"] == x and g["concurrency"] == 0
            assert abs(g["gap_pct"] - 100 * (x - t) / t) < 1e-9
    # the same engine args: an open loop below saturation gives the same req/s (the offered
    # rate) and the same per-token time on both sides
    by = {(g["rate"], g["metric"]): g for g in gaps["lab"]}
    for rate in (8.0, 16.0):
        assert abs(by[rate, "req_s"]["gap_pct"]) < 15, by[rate, "req_s"]
        assert abs(by[rate, "itl_ms_p50"]["gap_pct"]) < 25, by[rate, "itl_ms_p50"]
    md = (out / "fidelity.md").read_text()
    assert "| rate=16/s | ITL p50 (ms) |" in md and "| twin | gap | verdict |" in md
    assert "levels line up by offered rate" in md


#: requests of the replayed trace: its arrivals take the replay's time (no figure is asserted)
TRACE_REQUESTS = 8


def test_fidelity_trace_replays_the_same_trace_on_both_sides(
        true_target: str, true_engine_args: Path, tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    write_trace(trace, synth_trace(SynthSpec(requests=TRACE_REQUESTS, rate=12.0, isl=128,
                                             osl=8, prefix_groups=2, prefix_blocks=1,
                                             block_size=64)))
    out = tmp_path / "fid"
    proc = lab("fidelity", "--target", true_target, "--engine-args", str(true_engine_args),
               "--trace", str(trace), "--trace-block-size", "64", *COMMON, "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    gaps = json.loads((out / "fidelity.json").read_text())["gaps"]["lab"]
    assert {g["metric"] for g in gaps} == {m for m, _ in METRICS}
    assert {g["level"] for g in gaps} == {"trace"}
    levels = {side: _levels(out / side) for side in ("target", "lab")}
    for side in ("target", "lab"):
        assert len(levels[side]) == 1
        assert int(levels[side]["requests"].iloc[0]) == TRACE_REQUESTS
        config = json.loads((out / side / "config.json").read_text())["sweep"]
        assert config["trace"]["path"] == str(trace)
    for g in gaps:
        assert g["target"] == levels["target"][g["metric"]].iloc[0]
        assert g["lab"] == levels["lab"][g["metric"]].iloc[0]
    md = (out / "fidelity.md").read_text()
    assert "| trace | TTFT p50 (ms) |" in md and "Load: replay of" in md


def test_fidelity_suite_runs_every_workload_and_gives_the_mean_absolute_gaps(
        fast_target: str, true_engine_args: Path, tmp_path: Path) -> None:
    out = tmp_path / "suite"
    proc = lab("fidelity", "--target", fast_target, "--engine-args", str(true_engine_args),
               "--speedup", SUITE_SPEEDUP, "--suite", "--requests", "6", "--warmup", "1",
               *COMMON, "--out", str(out), timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for entry in SUITE:  # progress: which workload, which side
        assert f"{entry.name} (" in proc.stderr
    assert "the target's saturation is" in proc.stderr
    doc = json.loads((out / "suite.json").read_text())
    sat = doc["saturation"]
    assert sat["concurrency"] == 64 and sat["req_s"] == pytest.approx(
        float(_levels(out / "saturation")["req_s"].iloc[0]))
    rows = doc["rows"]
    levels = {(r["workload"], r["level"]) for r in rows}
    rates = [round(f * sat["req_s"], 3) for f in (0.5, 0.8, 1.0)]
    assert levels == {*((w, f"c={c}") for w in ("isl512-osl64", "isl2048-osl32")
                        for c in (1, 8, 32)),
                      *(("poisson-near-sat", f"rate={r:g}/s") for r in rates),
                      ("prefix-trace", "trace")}
    assert len(rows) == len(levels) * len(METRICS)
    for entry in SUITE:  # each workload swept on both sides, with the request count asked
        for side in ("target", "lab"):
            table = _levels(out / entry.name / side)
            assert (table["requests"] == 6).all(), (entry.name, side, table)
    target = _levels(out / "isl2048-osl32" / "target").set_index("concurrency")
    row = next(r for r in rows if r["workload"] == "isl2048-osl32" and r["level"] == "c=8"
               and r["metric"] == "latency_ms_p50")
    assert row["target"] == target.loc[8, "latency_ms_p50"]
    assert row["target_spread_pct"] is None or row["target_spread_pct"] != row[
        "target_spread_pct"]  # NaN: one repeat has no spread
    summary = doc["summary"]["lab"]
    for metric, _ in METRICS:
        gaps = [abs(r["sides"]["lab"]["gap_pct"]) for r in rows if r["metric"] == metric]
        assert summary[metric]["mean_abs_gap_pct"] == pytest.approx(sum(gaps) / len(gaps))
        assert summary[metric]["within_15_pct"] == pytest.approx(
            100 * sum(g <= 15 for g in gaps) / len(gaps))
    # the target IS the lab's mocker with the same engine args: the gaps are noise (6
    # requests a level, on a loaded box)
    assert summary["latency_ms_p50"]["mean_abs_gap_pct"] < 25, summary
    assert summary["all"]["mean_abs_gap_pct"] < 40, summary
    md = (out / "suite.md").read_text()
    assert md == proc.stdout.rstrip("\n") + "\n" or md.strip() in proc.stdout
    assert "## Mean absolute gap over the levels" in md and "within 15%" in md
    assert "| latency p50 (ms) | isl2048-osl32 | c=8 |" in md


def _inflight(url: str) -> float:
    """The requests a lab frontend is serving (its /metrics)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    found = re.search(r"^lab_frontend_inflight_requests (\S+)$", text, re.M)
    assert found, text
    return float(found[1])


def test_sigterm_mid_suite_leaves_no_lab_stack(
        fast_target: str, true_engine_args: Path, tmp_path: Path) -> None:
    """SIGTERM while the lab side sweeps (a lab at speedup 0.1, far slower than the target, so
    its first request is in flight for seconds): exit 130 with every process of the lab stack
    gone."""
    out = tmp_path / "suite"
    err = tmp_path / "stderr.txt"
    with open(err, "w") as f:
        proc = subprocess.Popen(
            [LAB, "fidelity", "--target", fast_target, "--engine-args", str(true_engine_args),
             "--speedup", "0.1", "--suite", "--requests", "2", "--warmup", "0", *COMMON,
             "--out", str(out)],
            stdout=subprocess.DEVNULL, stderr=f, cwd=ROOT, start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
    def running(check: Callable[[], T]) -> Callable[[], T]:
        def alive() -> T:
            assert proc.poll() is None, err.read_text()
            return check()
        return alive

    try:
        ready = wait_until(running(lambda: re.search(r"lab stack ready: (\S+)", err.read_text())),
                           60, "the lab stack's ready line")
        # in the first workload's sweep: a request of the lab side in flight (not a fixed
        # wait: its prefill at speedup 0.1 outlasts the sidecar's 2 s stall watch, which fails
        # the level)
        wait_until(running(lambda: _inflight(ready[1]) > 0), 60, "a lab request in flight")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 130, err.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "interrupted" in err.read_text()
    started = [e["pid"] for e in read_events(out / "stack-lab" / "events.jsonl")
               if e["event"] == "start" and e.get("pid")]
    assert started
    alive = [p for p in started if psutil.pid_exists(p)
             and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, alive


@pytest.mark.parametrize(("args", "says"), [
    (("--suite", "--conc", "1,2"), "--conc: --suite sweeps its own workloads"),
    (("--suite", "--rate", "3"), "--rate: --suite sweeps its own workloads"),
    (("--rate", "3", "--conc", "4"), "--conc and --rate are alternatives"),
    (("--trace", "{trace}", "--rate", "3"), "--trace and --rate are alternatives"),
    (("--also-engine-args", "lab={trace}"), "'--also-engine-args'"),
    (("--also-engine-args", "x=/nonexistent.json"), "no file /nonexistent.json"),
    (("--rate", "fast"), "--rate"),
])
def test_bad_shape_options_are_usage_errors_naming_the_option(
        args: tuple[str, ...], says: str, tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    write_trace(trace, synth_trace(SynthSpec(requests=2)))
    result = CliRunner().invoke(fidelity, ["--target", "http://127.0.0.1:9",
                                           *[a.format(trace=trace) for a in args],
                                           "--out", str(tmp_path / "x")])
    assert result.exit_code == 2, result.output
    assert says in result.output, result.output
    assert not (tmp_path / "x").exists()
