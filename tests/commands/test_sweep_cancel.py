"""`lab sweep --cancel` over real processes: the client leaves requests mid-stream, and after the
level the leak check finds every engine, sidecar and the frontend back at their idle values.
A deliberately leaking engine, and the three disaggregated windows, are in
`test_sweep_cancel_windows.py` (one stack each, driven in process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

from lab.sweep.leak_check import LEAKS_JSON

ENGINE_FIGURES = {"running_requests", "queued_requests", "used_kv_blocks", "open_streams"}


def sweep(out: Path, *args: str, env: dict[str, str] | None = None,
          timeout: float = 120) -> subprocess.CompletedProcess:
    lab = str(Path(sys.executable).parent / "lab")
    return subprocess.run(
        [lab, "sweep", "--out", str(out), "--no-plots", "--quiet", *args],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


def leak_report(out: Path) -> dict:
    reports = json.loads((out / LEAKS_JSON).read_text())
    assert list(reports) == ["c=2"], reports
    return reports["c=2"]


def assert_engines_idle(report: dict, engines: list[str]) -> None:
    assert report["leaks"] == [], report
    for name in engines:
        figures = report["figures"][name]
        assert set(figures) >= ENGINE_FIGURES, figures
        assert all(v == 0 for v in figures.values()), (name, figures)


def test_cancelled_level_leaves_every_process_idle(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = sweep(out, "--conc", "2", "--requests", "6", "--warmup", "0", "--isl", "32",
                 "--osl", "100", "--speedup", "1",
                 "--engine-args", '{"timing": {"type": "fixed", "prefill_ms": 5, "decode_ms": 5}}',
                 "--cancel", "0.5", "--cancel-after", "3tok", "--cancel-seed", "7")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = leak_report(out)
    assert_engines_idle(report, ["engine-0"])
    assert report["figures"]["sidecar-0"] == {"in_flight": 0}
    assert report["figures"]["frontend"]["inflight_requests"] == 0
    requests = pd.read_parquet(out / "requests.parquet")
    cancelled = requests[requests["cancelled"]]
    # the seeded picks of --cancel-seed 7 (lab.load.cancel), each closed after the read that
    # brought its 3rd token (a read may bring several), long before its 100th
    assert len(cancelled) >= 1
    assert cancelled["chunks"].between(3, 99).all(), cancelled["chunks"]
    assert (cancelled["cancelled_ns"] >= cancelled["end_ns"]).all()
    assert cancelled["error_kind"].isna().all() and not cancelled["ok"].any()
    levels = pd.read_csv(out / "levels.csv")
    assert levels.loc[0, "cancelled"] == len(cancelled) and levels.loc[0, "failed"] == 0


