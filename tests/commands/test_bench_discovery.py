"""`lab bench-discovery` against a real local etcd: one table row per worker count, with the
watcher having seen every registration and every refresh (its message count), and the cost of a
refresh that changes nothing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from launch.etcd import etcd_available

ETCD_OK, ETCD_REASON = etcd_available()


@pytest.mark.skipif(not ETCD_OK, reason=f"needs etcd: {ETCD_REASON}")
def test_bench_discovery_prints_a_row_per_worker_count() -> None:
    lab = str(Path(sys.executable).parent / "lab")
    proc = subprocess.run([lab, "bench-discovery", "--workers", "2,5", "--events", "6"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split("|")[1:-1] for line in proc.stdout.splitlines()
            if re.match(r"\| \d", line)]
    assert [int(r[0]) for r in rows] == [2, 5]
    for row in rows:
        workers, messages = int(row[0]), int(row[-2])
        figures = [float(v) for v in row[1:-2]]
        watcher_reg, watcher_refresh, writer, etcd_cpu, etcd_rss = figures
        unchanged = [float(v) for v in row[-1].split("/")]
        # an unchanged refresh (a keepalive) costs the writer a request, the watcher nothing
        # it must see (no event), etcd a keepalive
        assert len(unchanged) == 3 and all(v >= 0 for v in unchanged) and unchanged[1] > 0, row
        # the watcher and writer are timed on their own CPU clocks (ns); etcd's CPU comes
        # from /proc in clock ticks, so a few events of a quiet etcd can round to 0
        assert watcher_reg > 0 and watcher_refresh > 0 and writer > 0, row
        assert etcd_cpu >= 0 and etcd_rss > 0, row
        # at least the initial set, and one message per refresh batch seen
        assert messages >= 2, row
        assert workers >= 2


def test_bench_discovery_refuses_a_bad_worker_list() -> None:
    lab = str(Path(sys.executable).parent / "lab")
    proc = subprocess.run([lab, "bench-discovery", "--workers", "10,x"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert "--workers" in proc.stderr and "'10,x'" in proc.stderr
