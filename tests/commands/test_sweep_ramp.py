"""`lab sweep --ramp-up`, end to end over a launched stack: a closed-loop level starts its
slots spread over the ramp, a rate level's rate grows linearly over it, and what is sent during
the ramp is recorded as warm-up, outside the measured window and the level's figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from lab.analysis.rundir import read_requests
from lab.report.build import ramp_spans

LAB = str(Path(sys.executable).parent / "lab")
# ~50 ms per request (OSL 4 at 10 ms per pass), room for every slot
ENGINE = json.dumps({"max_num_seqs": 16,
                     "timing": {"type": "fixed", "prefill_ms": 1, "decode_ms": 10}})
COMMON = ["--osl", "4", "--isl", "8", "--speedup", "1", "--engine-args", ENGINE, "--quiet",
          "--in-process-client"]
S = 1_000_000_000


def in_flight(req: pd.DataFrame, t: int) -> int:
    return int(((req["sent_ns"] <= t) & (req["done_ns"] > t)).sum())


def test_a_closed_loop_ramp_spreads_the_slots_and_is_not_measured(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = subprocess.run(
        [LAB, "sweep", "--conc", "4", "--ramp-up", "1", "--requests", "30", "--out", str(run),
         "--no-plots", *COMMON],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    req = pd.read_parquet(run / "requests.parquet")
    start = int(req["sent_ns"].min())
    ramp = req["sent_ns"] < start + S
    # recorded, flagged warm-up, exactly the requests sent during the ramp (about 5 s of slot
    # time at ~50 ms each: dozens)
    assert ramp.sum() >= 10 and req[ramp]["warmup"].all() and not req[~ramp]["warmup"].any()
    assert int((~req["warmup"]).sum()) == 30
    # slot k starts k/4 of the ramp in: one in flight in the first 0.2 s, four at its end
    early = [in_flight(req, t) for t in range(start, start + S // 5, S // 100)]
    late = [in_flight(req, t) for t in range(start + S * 8 // 10, start + S, S // 100)]
    assert max(early) == 1 and max(late) == 4
    level = pd.read_csv(run / "levels.csv").iloc[0]
    assert level["requests"] == 30 and level["warmup"] == ramp.sum()
    assert level["window_start_ns"] >= start + S
    assert "ramped up over 1 s first (not measured)" in (run / "report.md").read_text()
    # the timeline plot shades the ramp: from the level's first request, 1 s long
    assert ramp_spans(read_requests(run), 1.0) == [(start, start + S)]


def test_a_rate_ramp_grows_the_rate_linearly_and_is_not_measured(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = subprocess.run(
        [LAB, "sweep", "--rate", "40", "--arrival", "constant", "--ramp-up", "1",
         "--requests", "20", "--out", str(run), "--no-plots", *COMMON],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    req = pd.read_parquet(run / "requests.parquet").sort_values("intended_ns")
    warm, measured = req[req["warmup"]], req[~req["warmup"]]
    assert len(measured) == 20
    # 40/s constant is s_i = i/40; ramped over T = 1 s, arrival i is at sqrt(2 T s_i) while
    # that is within the ramp (19 of them), then keeps its 25 ms gaps
    assert len(warm) in (19, 20)
    start = int(measured["intended_ns"].iloc[0]) - (S if len(warm) == 19 else S + S // 40)
    s_i = np.arange(1, len(warm) + 1) / 40.0
    offsets = (warm["intended_ns"].to_numpy() - start) / S
    assert np.allclose(offsets, np.sqrt(2.0 * s_i), atol=1e-3)
    assert np.allclose(np.diff(measured["intended_ns"].to_numpy()) / S, 0.025, atol=1e-6)
    level = pd.read_csv(run / "levels.csv").iloc[0]
    assert level["requests"] == 20 and level["window_start_ns"] >= start + S
