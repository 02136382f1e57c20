"""The sidecar's stall window and readiness probe cover its engine's longest silent stretch
(launch.commands `stall_window_s`, `probe_timeout_s`): an engine whose prefill pass takes longer
than the default 2 s window (a calibrated CPU engine's 2,048-token pass took 2.7 s) registers
and serves, and is not withdrawn mid-pass."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from lab.shared.settings import SidecarTiming
from launch.commands import (
    STALL_MARGIN,
    Programs,
    probe_timeout_s,
    sidecar_argv,
    stall_window_s,
)
from launch.topology import FleetSpec, TopologySpec

#: a prefill pass of 3 s, longer than the default window; 1 ms decode steps
SLOW_PREFILL = {"timing": {"type": "fixed", "prefill_ms": 3000.0, "decode_ms": 1.0},
                "max_num_batched_tokens": 8192}
LAB = str(Path(sys.executable).parent / "lab")


def test_the_window_is_the_default_or_the_engines_longest_silence() -> None:
    assert stall_window_s(FleetSpec(role="aggregated", speedup=1)) == SidecarTiming.stall_s
    # a 32,767-token prompt alone: 4 passes of at most 8,192 tokens, 3 s each
    slow = FleetSpec(role="aggregated", engine_args=SLOW_PREFILL, speedup=1)
    assert stall_window_s(slow) == pytest.approx(STALL_MARGIN * 4 * 3.0)
    assert stall_window_s(FleetSpec(role="aggregated", engine_args=SLOW_PREFILL,
                                    speedup=10)) == SidecarTiming.stall_s
    # the canary: one 3 s pass
    assert probe_timeout_s(slow) == pytest.approx(STALL_MARGIN * 3.0)
    argv = sidecar_argv(Programs(lab=["lab"]),
                        TopologySpec.aggregated(), slow, "127.0.0.1:1", "file:/tmp/d", "s-0")
    assert argv[argv.index("--stall") + 1] == "18.0", argv
    assert argv[argv.index("--probe-timeout") + 1] == "4.5", argv


def test_a_prefill_pass_longer_than_the_default_window_is_served(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = subprocess.run(
        [LAB, "sweep", "--engine-args", json.dumps(SLOW_PREFILL), "--speedup", "1",
         "--conc", "2", "--requests", "2", "--warmup", "0", "--isl", "16", "--osl", "2",
         "--in-process-client", "--quiet", "--no-plots", "--out", str(run)],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    req = pd.read_parquet(run / "requests.parquet")
    assert req["ok"].all(), req["error_message"].tolist()
    # one 3 s prefill pass for both prompts, with both in flight and no token for longer than
    # the default window
    ttft_s = (req["first_ns"] - req["sent_ns"]) / 1e9
    assert (ttft_s > SidecarTiming.stall_s).all(), ttft_s.tolist()
