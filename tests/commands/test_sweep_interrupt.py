"""Ctrl-C in the middle of a level: the sweep stops promptly, cleanly, and takes its client
processes with it (no traceback, no orphan task, no process left)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from lab.load.client import CLIENT_JOIN_TIMEOUT_S


def _wait_for_clients(proc: subprocess.Popen, timeout: float = 60.0) -> list[psutil.Process]:
    """The sweep's two client processes, once both run; fails with the sweep's own output if
    it exits first (a child list that stays empty would otherwise hide why)."""
    deadline = time.monotonic() + timeout
    clients: list[psutil.Process] = []
    while len(clients) < 2:
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the sweep exited ({proc.returncode}) first:\n{out}\n{err}")
        assert time.monotonic() < deadline, "the level's client processes never started"
        time.sleep(0.2)
        clients = psutil.Process(proc.pid).children(recursive=True)
    return clients


#: a timed level far longer than the test: its prompts are made as they are sent, where a
#: counted level of 100,000 requests built them all first (~20 s before any client started)
ENDLESS_LEVEL = ("--duration", "300")


def test_sigint_mid_level_stops_the_sweep_and_its_client_processes(spawn, tmp_path: Path) -> None:
    server = spawn("fake", ["python", "-m", "tests.bench.fake_sse", "--token-interval-ms", "1"])
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "lab", "sweep", "--target", f"http://{server.address}",
         "--model", "fake", "--conc", "2", "--client-procs", "2", *ENDLESS_LEVEL,
         "--osl", "64", "--out", str(out), "--no-plots"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # a normal foreground process: SIGINT not ignored (as it would be for a shell's `cmd &`)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        clients = _wait_for_clients(proc)
        time.sleep(1.0)  # in the middle of the level
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, alive = psutil.wait_procs(clients, timeout=30)
        clients_gone_s = time.monotonic() - t0
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, stderr[-2000:]
    assert "interrupted" in stderr
    assert "Traceback" not in stderr and "never retrieved" not in stderr, stderr[-3000:]
    assert [c.pid for c in alive] == []
    # The clients are terminated at once: a client that ignored it would live until the
    # 5 s join timeout ran out and it was killed. (Writing the partial run takes longer
    # on a loaded machine, so only the clients' end is timed.)
    assert clients_gone_s < CLIENT_JOIN_TIMEOUT_S - 0.5, f"clients lived {clients_gone_s:.1f} s"


def test_a_sigkilled_sweep_takes_its_client_processes_with_it(spawn, tmp_path: Path) -> None:
    server = spawn("fake", ["python", "-m", "tests.bench.fake_sse", "--token-interval-ms", "1"])
    proc = subprocess.Popen(
        [sys.executable, "-m", "lab", "sweep", "--target", f"http://{server.address}",
         "--model", "fake", "--conc", "2", "--client-procs", "2", *ENDLESS_LEVEL,
         "--osl", "64", "--out", str(tmp_path / "run"), "--no-plots", "--quiet"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    clients: list[psutil.Process] = []
    try:
        clients = _wait_for_clients(proc)
        time.sleep(1.0)
        proc.kill()
        proc.wait(10)
        _, alive = psutil.wait_procs(clients, timeout=10)
        assert alive == [], f"client processes outlived a SIGKILLed lab: {alive}"
    finally:
        for c in clients:
            with contextlib.suppress(psutil.NoSuchProcess):
                c.kill()
        if proc.poll() is None:
            proc.kill()
