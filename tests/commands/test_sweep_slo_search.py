"""`lab sweep --conc auto` / `--rate auto` with SLOs, end to end over a launched stack whose
engine has a known latency: a `fixed` timing model at speedup 1 and 2 sequence slots, so a
request takes L0 (its passes) at up to 2 in flight and waits out another's at 3."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
from click.testing import CliRunner

from lab.commands.sweep import sweep
from lab.open_loop.rate_search import GROW
from tests.usage_errors import assert_usage_error, usage_cases

LAB = str(Path(sys.executable).parent / "lab")
# 2 slots, 30 ms per decode pass: OSL 4 takes ~130 ms alone; a third request in flight waits
# for a slot (half a request on average, a whole one when the two are in step)
SLOW_ENGINE = json.dumps({"max_num_seqs": 2,
                          "timing": {"type": "fixed", "prefill_ms": 1, "decode_ms": 30}})
COMMON = ["--osl", "4", "--isl", "8", "--speedup", "1", "--engine-args", SLOW_ENGINE,
          "--quiet", "--no-plots", "--in-process-client"]


@usage_cases(
    ("--conc auto", "--slo"),
    "--conc auto --slo-ttft-ms 10 --slo-share 0",
    "--conc auto --slo-ttft-ms 10 --slo-share 1.5",
    "--conc auto --slo-ttft-ms 10 --max-levels 1",
    "--ramp-up -1",
    ("--conc auto --slo-ttft-ms 10 --shard 0/2 --target http://127.0.0.1:9", "--conc auto"),
)
def test_bad_search_options_are_usage_errors(args: list[str], named: str) -> None:
    result = CliRunner().invoke(sweep, args)
    assert_usage_error(result.exit_code, result.output, named)


def test_conc_auto_finds_the_engines_slot_count_as_the_latency_slo_edge(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = subprocess.run(
        [LAB, "sweep", "--conc", "auto", "--slo-latency-ms", "175", "--slo-share", "0.9",
         "--requests", "12", "--warmup", "2", "--out", str(run), *COMMON],
        capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    levels = pd.read_csv(run / "levels.csv").sort_values("window_start_ns")  # in the order run
    tried = list(levels["concurrency"])
    assert tried[0] == 32 and len(tried) <= 8
    passed = levels[levels["slo_share"] >= 0.9]
    # the known edge is the engine's 2 slots (1 if this machine's jitter pushed c=2's tail
    # past the SLO); no level of 3 or more in flight can pass
    assert not passed.empty, levels[["concurrency", "slo_share"]]
    edge = int(passed["concurrency"].max())
    assert edge in (1, 2), levels[["concurrency", "slo_share", "latency_ms_p50"]]
    assert (levels[levels["concurrency"] >= 3]["slo_share"] < 0.9).all()
    assert edge + 1 in tried  # bisected to adjacent levels
    assert {"goodput_req_s", "slo_share_lo", "slo_share_hi"} <= set(levels.columns)
    assert f"SLO edge (latency <= 175 ms; at least 90% of requests good, {len(tried)} " \
        "concurrency levels of at most 8)" in proc.stdout
    assert f"c={edge} is the highest that passed" in proc.stdout
    assert "goodput (latency <= 175 ms):" in (run / "report.md").read_text()


def test_rate_auto_with_an_slo_below_the_engines_latency_passes_no_rate(tmp_path: Path) -> None:
    """Every request takes ~130 ms, so a 60 ms latency SLO holds at no rate: the search steps
    down by GROW from the closed-loop throughput after every level, sustained or not (by the
    sustained rule alone the lowest rates, well below the engine's ~15 req/s, would pass)."""
    run = tmp_path / "run"
    proc = subprocess.run(
        [LAB, "sweep", "--rate", "auto", "--slo-latency-ms", "60", "--max-levels", "3",
         "--requests", "16", "--warmup", "2", "--arrival", "constant", "--out", str(run),
         *COMMON],
        capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    levels = pd.read_csv(run / "levels.csv")
    rated = levels[levels["rate"].notna()].sort_values("window_start_ns")
    rates = list(rated["rate"])
    assert len(rates) == 3
    for a, b in itertools.pairwise(rates):
        assert abs(b - round(a / GROW, 1)) < 0.11, rates
    assert (rated["slo_share"] < 0.99).all()
    assert "no level passed" in proc.stdout
