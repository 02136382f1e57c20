"""Children die with the launcher: PR_SET_PDEATHSIG, set in the child before it runs its program.

The kernel sends the signal when the *thread* that started the child exits, so the launcher
spawns from its event-loop thread (the main thread for `lab up` and `lab sweep`). A child whose
parent already died before its prctl kills itself at once.

The launcher does not set it in a `preexec_fn`. A preexec_fn makes subprocess use fork()
instead of vfork(), and fork() runs grpc's pthread_atfork handlers, which can deadlock against
grpc's own shutdown thread in a process that has used grpc (grpc/grpc#37259: the launcher hung
in fork() inside the test suite). Instead a child is started through this module
(`through_pdeath`): `python -m lab.shared.pdeath PARENT -- PROGRAM ARGS...` sets the signal and
checks the parent, then execs PROGRAM, which keeps the setting (the kernel clears it only for a
set-user-ID or file-capability binary). The spawn itself is then a plain vfork + exec.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import signal
import sys
from collections.abc import Callable
from typing import Literal, NoReturn

PR_SET_PDEATHSIG = 1

_libc: ctypes.CDLL | Literal[False] | None = None  # False: no libc to load


def _prctl() -> Callable[..., int] | None:
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        except OSError:
            _libc = False
    return _libc.prctl if _libc else None


def make_preexec(sig: int = signal.SIGKILL, parent: int | None = None) -> Callable[[], None]:
    """A preexec_fn: set the parent-death signal, and die if the parent is already gone."""
    parent = os.getpid() if parent is None else parent
    prctl = _prctl()  # resolved before fork: no dlopen in the child

    def preexec() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


def die_with_parent(parent: int, sig: int = signal.SIGKILL) -> None:
    """The same, from inside an already-started child (e.g. a multiprocessing "spawn" child)."""
    make_preexec(sig, parent)()


def through_pdeath(argv: list[str], parent: int | None = None) -> list[str]:
    """`argv` started so that it gets SIGKILL when `parent` (default: this process) exits.

    FileNotFoundError naming the program when it is not found, as Popen would raise it.
    """
    if shutil.which(argv[0]) is None:
        raise FileNotFoundError(2, "No such file or directory", argv[0])
    parent = os.getpid() if parent is None else parent
    return [sys.executable, "-m", "lab.shared.pdeath", str(parent), "--", *argv]


def _exec_with_parent_death(args: list[str]) -> NoReturn:
    """`PARENT -- PROGRAM ARGS...`: die with PARENT, then become PROGRAM."""
    if len(args) < 3 or args[1] != "--" or not args[0].isdigit():
        sys.exit("usage: python -m lab.shared.pdeath PARENT_PID -- PROGRAM [ARGS...]")
    die_with_parent(int(args[0]))
    try:
        os.execvp(args[2], args[2:])
    except OSError as exc:
        sys.exit(f"cannot run {args[2]!r}: {exc.strerror or exc}")


if __name__ == "__main__":
    _exec_with_parent_death(sys.argv[1:])
