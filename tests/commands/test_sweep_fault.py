"""`lab sweep --fault`: a kill mid-sweep; the sweep completes, failures only on the killed worker,
and the report has a fault section and a timeline plot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd

from lab.analysis.faults import analyse_faults, request_workers
from lab.analysis.rundir import read_events


def test_kill_mid_sweep(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "lab"), "sweep", "--engines", "2", "--conc", "4",
         "--duration", "7", "--osl", "16", "--isl", "24", "--fault", "engine-1:kill@2s",
         "--restart-engine", "on-failure", "--out", str(run), "--quiet"],
        capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    req = pd.read_parquet(run / "requests.parquet")
    analysis = analyse_faults(req, read_events(run))
    (o,) = analysis.outcomes
    assert (o.process, o.kind, o.worker) == ("engine-1", "kill", "sidecar-1")
    assert o.t_ns < o.withdrawn_ns < o.registered_ns
    assert o.sidecar_exit_code == 1
    assert o.failed_other_worker == 0 and o.ok_other_worker_during > 0
    failed = req[~req["ok"]]
    assert set(request_workers(failed).dropna()) <= {"sidecar-1"}
    # sidecar-1 served again after it registered
    back = req[(req["done_ns"] > o.registered_ns) & req["ok"]]
    assert (back["decode_worker_id"] == "sidecar-1").any()
    md = (run / "report.md").read_text()
    assert "## Faults" in md and "kill engine-1" in md and "left discovery" in md
    assert (run / "plots" / "fault_timeline.png").exists()
