"""`--server-pid` with nested named processes (vLLM's API server -> EngineCore -> Worker): each
descendant's CPU counts once, under its nearest named ancestor.

Real processes: a spinning parent (named) starts a spinning child (named), which starts a
spinning grandchild (not named). The sampler's rows are checked against the processes' own CPU
times over the same window: the total holds (no double count) and the split is right (the parent
carries itself, the child carries itself and the grandchild).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from launch.process import ProcessView
from launch.sampler import Sampler

# Spins for at most 30 s (a test that dies leaves nothing running long); at depth > 0 it first
# starts itself at depth - 1. Each prints "depth pid" once it runs.
SPIN = """
import os, subprocess, sys, time
depth = int(sys.argv[1])
if depth:
    subprocess.Popen([sys.executable, "-c", "CODE = %r\\nexec(CODE)" % CODE, str(depth - 1)])
print(depth, os.getpid(), flush=True)
end = time.monotonic() + 30
while time.monotonic() < end:
    pass
"""


def _spin_code() -> str:
    return f"CODE = {SPIN!r}\nexec(CODE)"


@pytest.fixture
def tree() -> Iterator[dict[int, int]]:
    """depth -> pid of the three spinning processes (2: parent, 1: child, 0: grandchild)."""
    popen = subprocess.Popen([sys.executable, "-c", _spin_code(), "2"], stdout=subprocess.PIPE,
                             text=True, start_new_session=True)
    try:
        pids: dict[int, int] = {}
        assert popen.stdout is not None
        while len(pids) < 3:
            line = popen.stdout.readline()
            assert line, f"the spinning tree exited early (pids so far {pids})"
            depth, pid = line.split()
            pids[int(depth)] = int(pid)
        yield pids
    finally:
        os.killpg(popen.pid, signal.SIGKILL)
        popen.wait()


def _cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def test_nested_named_processes_count_each_descendant_once(tree: dict[int, int],
                                                           tmp_path: Path) -> None:
    views = [ProcessView(name, "server", None, tree[depth], None, "ready", 0,
                         create_time=psutil.Process(tree[depth]).create_time())
             for name, depth in (("frontend", 2), ("engine", 1))]
    sampler = Sampler(lambda: views, tmp_path / "procs.parquet", include_children=True)
    sampler.sample_once()  # primes the named processes
    sampler.sample_once()  # primes the descendants
    t0, before = time.monotonic(), {d: _cpu_s(pid) for d, pid in tree.items()}
    time.sleep(1.0)
    rows = {row["name"]: row["cpu_pct"] for row in sampler.sample_once()}
    t1, after = time.monotonic(), {d: _cpu_s(pid) for d, pid in tree.items()}
    truth = {d: (after[d] - before[d]) / (t1 - t0) * 100 for d in tree}

    want = {"frontend": truth[2], "engine": truth[1] + truth[0]}
    assert min(truth.values()) > 10, f"the spinners barely ran: {truth}"
    total = sum(truth.values())
    assert sum(rows.values()) == pytest.approx(total, rel=0.2, abs=10), (rows, want)
    for name, pct in want.items():
        assert rows[name] == pytest.approx(pct, rel=0.25, abs=10), (name, rows, want)
