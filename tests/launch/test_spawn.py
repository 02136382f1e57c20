"""How the launcher starts a process: a plain vfork + exec, and the child dies with its parent.

A preexec_fn would make subprocess fork(), which runs every at-fork handler of the launcher
process; grpc's can deadlock there (lab/shared/pdeath.py). Python calls its own at-fork hooks
(os.register_at_fork) on exactly that path, so a hook that never fires shows the spawn is not a
fork with a preexec_fn.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from lab.shared.pdeath import through_pdeath
from launch.process import ManagedProcess

_forks: list[int] = []
os.register_at_fork(before=lambda: _forks.append(os.getpid()))


def test_spawning_a_supervised_process_runs_no_at_fork_handler(tmp_path: Path) -> None:
    proc = ManagedProcess("sleeper", "engine", None, "never",
                          lambda _: [sys.executable, "-c", "import time; time.sleep(30)"],
                          tmp_path / "sleeper.log", {})
    before = len(_forks)
    proc.start()
    try:
        assert len(_forks) == before
        assert proc.pid is not None and psutil.pid_exists(proc.pid)
    finally:
        proc.signal_group(signal.SIGKILL)
        assert proc.popen is not None
        proc.popen.wait(10)


def test_a_child_started_through_pdeath_dies_with_its_parent(tmp_path: Path) -> None:
    """The parent is a small Python process that starts a sleeper and waits; SIGKILLing the
    parent (no teardown code runs) must take the sleeper."""
    pid_file = tmp_path / "child.pid"
    child_py = tmp_path / "child.py"
    child_py.write_text("import os, sys, time\n"
                        "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
                        "time.sleep(60)\n")
    parent_py = tmp_path / "parent.py"
    parent_py.write_text("import subprocess, sys, time\n"
                         "from lab.shared.pdeath import through_pdeath\n"
                         "subprocess.Popen(through_pdeath([sys.executable, *sys.argv[1:]]))\n"
                         "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, str(parent_py), str(child_py), str(pid_file)])
    try:
        deadline = time.monotonic() + 30
        while not (pid_file.exists() and pid_file.read_text()):
            assert parent.poll() is None, "the parent exited"
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.05)
        child = psutil.Process(int(pid_file.read_text()))
        assert child.ppid() == parent.pid  # the trampoline exec'd the program in place
        parent.kill()
        parent.wait(10)
        child.wait(timeout=10)  # psutil.TimeoutExpired if it outlived its parent
    finally:
        if parent.poll() is None:
            parent.kill()


def test_a_missing_program_is_refused_before_anything_starts() -> None:
    with pytest.raises(FileNotFoundError, match="no-such-program-here"):
        through_pdeath(["no-such-program-here", "--flag"])
