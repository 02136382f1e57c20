"""`python -m tests.bench.load_bench` end to end (tiny): the fake one-chunk-per-token server as its
own process, the client in a child process, the figures printed."""

from __future__ import annotations

import re
import subprocess
import sys


def test_bench_prints_cpu_and_send_delay() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tests.bench.load_bench", "--conc", "1,4", "--requests", "12",
         "--repeat", "1", "--osl", "16"],
        capture_output=True, text=True, timeout=120, check=True).stdout
    rows = [line for line in out.splitlines() if line.startswith("c=")]
    assert len(rows) == 2, out
    for row in rows:
        assert "chunks/req   16" in row and "errors 0" in row, row
        cpu = float(re.search(r"client CPU ([\d.]+) ms/req", row).group(1))  # type: ignore[union-attr]
        assert 0 < cpu < 100
        assert re.search(r"send delay p99 [\d.]+ ms", row)
    assert "budget:" in out


def test_bench_rejects_bad_levels() -> None:
    res = subprocess.run([sys.executable, "-m", "tests.bench.load_bench", "--conc", "0,x"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--conc" in res.stderr
