"""--client-realtime over real processes: `lab sweep` against its launched stack, the client
processes on SCHED_RR (client.json says so, closed and open loop), and a clear refusal where
the kernel will not give real-time scheduling."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lab.load.priority import on_this_machine

LAB = str(Path(sys.executable).parent / "lab")
SMALL = ("--requests", "4", "--warmup", "0", "--osl", "4", "--isl", "8", "--speedup", "0",
         "--no-plots", "--quiet")


def _sweep(out: Path, *args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, LAB, "sweep", *SMALL, "--out", str(out), *args],
                          capture_output=True, text=True, timeout=120)


def _scheduling(out: Path) -> dict[str, str]:
    return {level: health["scheduling"]
            for level, health in json.loads((out / "client.json").read_text()).items()}


def test_the_client_processes_run_real_time_only_when_asked(tmp_path: Path) -> None:
    normal = _sweep(tmp_path / "normal", "--conc", "1,2")
    assert normal.returncode == 0, normal.stdout + normal.stderr
    assert _scheduling(tmp_path / "normal") == {"1/0": "normal", "2/0": "normal"}
    closed = _sweep(tmp_path / "closed", "--conc", "1,2", "--client-realtime")
    assert closed.returncode == 0, closed.stdout + closed.stderr
    assert _scheduling(tmp_path / "closed") == {"1/0": "realtime", "2/0": "realtime"}
    rate = _sweep(tmp_path / "rate", "--rate", "20", "--client-realtime", "--client-procs", "2")
    assert rate.returncode == 0, rate.stdout + rate.stderr
    assert set(_scheduling(tmp_path / "rate").values()) == {"realtime"}


def test_realtime_is_refused_with_the_option_named_where_the_kernel_denies_it(
        tmp_path: Path) -> None:
    """Without CAP_SYS_NICE (and RLIMIT_RTPRIO 0, the default) SCHED_RR is refused: the sweep
    exits 1 naming --client-realtime, before any request."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or os.geteuid() != 0:
        pytest.skip("needs root and setpriv (util-linux) to drop CAP_SYS_NICE")
    proc = _sweep(tmp_path / "denied", "--conc", "1", "--client-realtime",
                  prefix=(setpriv, "--bounding-set=-sys_nice", "--inh-caps=-sys_nice"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "--client-realtime: the kernel refused real-time scheduling" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_realtime_and_an_in_process_client_are_a_usage_error(tmp_path: Path) -> None:
    proc = _sweep(tmp_path / "both", "--conc", "1", "--client-realtime", "--in-process-client")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--client-realtime" in proc.stderr and "--in-process-client" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(("url", "here"), [
    ("http://127.0.0.1:8901", True), ("http://127.0.0.5/v1", True), ("http://[::1]:80", True),
    ("http://localhost:8000", True), ("http://10.0.0.7:8000", False),
    ("http://example.com", False)])
def test_a_loopback_target_is_on_this_machine(url: str, here: bool) -> None:
    """Where `lab calibrate` warns that the client's wait for a core may land in the probes."""
    assert on_this_machine(url) is here
