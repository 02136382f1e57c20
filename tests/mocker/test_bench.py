"""`mocker bench` runs and prints its three figures (short durations)."""

from __future__ import annotations

import asyncio

import uvloop
from click.testing import CliRunner

from mocker.bench import measure_drift
from mocker.cli import main


def test_bench_prints_pass_cost_drift_and_streaming_figures():
    result = CliRunner().invoke(
        main, ["bench", "--drift-seconds", "1", "--stream-seconds", "1", "--concurrency", "8"]
    )
    assert result.exit_code == 0, result.output
    out = result.output
    for n in (1, 32, 128, 256):
        assert out.count(f"{n:4d} running:") == 2  # step, then fast_forward
    assert "(b) drift at speedup 1, 256 running" in out
    assert "(c) streaming at concurrency 8" in out and "tokens/s" in out and " 0 errors" in out


def test_engine_loop_keeps_simulated_time_with_absolute_deadlines():
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        d = runner.run(measure_drift(2.0, running=256))
    assert d.passes > 50
    # Relative sleeps would drift by pass cost / pass duration (~10-30% here); absolute
    # deadlines keep it near 0 (bound generous for a shared 2-core machine).
    assert abs(d.drift) < 0.05
