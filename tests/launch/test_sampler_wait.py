"""The sampler's CPU wait (cpu_wait_pct: time runnable but waiting for a CPU, from the kernel's
run-queue delay) over real processes: three spinners pinned to one core each get about a third
of it and wait the other two thirds; a sleeping process waits for nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import psutil
import pytest

from launch.process import ProcessView
from launch.sampler import Sampler, run_queue_wait_ns

SPIN = "import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end:\n    pass\n"

pytestmark = pytest.mark.skipif(run_queue_wait_ns(os.getpid()) is None,
                                reason="the kernel publishes no /proc/PID/task/*/schedstat")


@pytest.fixture
def pinned_spinners() -> Iterator[list[int]]:
    """Three processes spinning on one core (the lowest this process may use), and a sleeper."""
    core = min(os.sched_getaffinity(0))
    procs = [subprocess.Popen([sys.executable, "-c", SPIN],
                              preexec_fn=lambda: os.sched_setaffinity(0, {core}))
             for _ in range(3)]
    procs.append(subprocess.Popen(["sleep", "30"]))
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_cpu_wait_is_the_share_of_a_shared_core_a_process_did_not_get(
        pinned_spinners: list[int], tmp_path: Path) -> None:
    names = ["spin-a", "spin-b", "spin-c", "sleeper"]
    views = [ProcessView(name, "server", None, pid, None, "ready", 0,
                         create_time=psutil.Process(pid).create_time())
             for name, pid in zip(names, pinned_spinners, strict=True)]
    sampler = Sampler(lambda: views, tmp_path / "procs.parquet")
    sampler.sample_once()  # primes the counters
    time.sleep(1.5)
    rows = {row["name"]: row for row in sampler.sample_once()}
    spin = [rows[n] for n in names[:3]]
    # one core among three: ~33% each and ~67% waiting; on a loaded machine a little less CPU
    # and more wait, never the other way round
    assert sum(r["cpu_pct"] for r in spin) <= 110, spin
    for r in spin:
        share = r["cpu_wait_pct"] / (r["cpu_wait_pct"] + r["cpu_pct"])
        assert share > 0.5, r
    assert rows["sleeper"]["cpu_wait_pct"] < 5, rows["sleeper"]
    frame = pd.read_parquet(sampler.write())
    assert frame["cpu_wait_pct"].notna().all()
