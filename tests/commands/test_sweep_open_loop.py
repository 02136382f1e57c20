"""`lab sweep --rate` end to end over the launched stack: an open-loop sweep through a freeze
keeps sending at the intended times, counts every request, and the run directory has the
per-second timeline, the open-loop section and the fault's recovery sentence."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from click.testing import CliRunner

from lab.analysis.rundir import read_events
from lab.commands.sweep import sweep
from tests.in_process import lab
from tests.usage_errors import assert_usage_error, usage_cases


@usage_cases(
    "--rate 10,x",
    "--rate 0",
    "--rate 10,,20",
    "--rate 1e9",
    "--rate 5 --arrival gamma:x",
    "--rate 5 --arrival gamma:0",
    "--rate 5 --arrival uniform",
    ("--max-concurrency 4", "--rate"),
    "--rate 5 --max-concurrency 0",
    ("--rate 5 --conc 4", "--conc"),
)
def test_bad_open_loop_options_are_usage_errors(args: list[str], named: str) -> None:
    result = CliRunner().invoke(sweep, args)
    assert_usage_error(result.exit_code, result.output, named)


def test_open_loop_through_a_freeze_counts_every_request(tmp_path: Path) -> None:
    run = tmp_path / "run"
    rate, n = 40.0, 200
    proc = lab("sweep", "--engines", "2", "--rate", "40", "--requests", str(n), "--osl", "16",
               "--isl", "16", "--speedup", "1",
               "--fault", "engine-1:freeze@1.5s,engine-1:unfreeze@3.5s", "--out", str(run),
               "--quiet")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    req = pd.read_parquet(run / "requests.parquet")
    assert len(req) == n and req["rate"].eq(rate).all()
    freeze, unfreeze = (e["t_ns"] for e in read_events(run) if e.get("event") == "fault")
    during = req[(req["intended_ns"] >= freeze) & (req["intended_ns"] < unfreeze)]
    # ~2 s of a 40/s schedule: the client kept sending while the worker was out
    assert len(during) > 40
    assert ((during["sent_ns"] - during["intended_ns"]) < 200e6).all()
    timeline = pd.read_parquet(run / "timeline.parquet")
    assert int(timeline["sent"].sum()) == n and int(timeline["intended"].sum()) == n
    origin = int(np.minimum(req["intended_ns"].min(), req["sent_ns"].min()))
    freeze_s = (freeze - origin) / 1e9
    bins = timeline[(timeline["t_s"] >= np.floor(freeze_s)) & (timeline["t_s"] + 1 <=
                                                               (unfreeze - origin) / 1e9)]
    assert len(bins) >= 1 and (bins["sent"] > 0).all()
    assert int(timeline["completed"].sum() + timeline["errors"].sum()) == n
    md = (run / "report.md").read_text()
    assert "## Open loop" in md and "TTFT p99" in md and "freeze engine-1" in md
    assert (run / "plots" / "timeline.png").exists()


def test_rate_auto_brackets_the_saturation_rate(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = lab("sweep", "--rate", "auto", "--requests", "40", "--osl", "8", "--isl", "8",
               "--speedup", "1000", "--out", str(run), "--quiet", "--no-plots")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    levels = pd.read_csv(run / "levels.csv")
    closed = levels[levels["rate"].isna()]
    rated = levels[levels["rate"].notna()].sort_values("window_start_ns")  # in the order run
    assert list(closed["concurrency"]) == [32]
    assert 1 <= len(rated) <= 8
    first = rated.iloc[0]["rate"]  # the search starts from the closed loop's throughput
    assert abs(first - round(closed.iloc[0]["req_s"], 1)) < 0.11
    assert "saturation:" in proc.stdout
