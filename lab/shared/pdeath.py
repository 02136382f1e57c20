"""Children die with the launcher: PR_SET_PDEATHSIG in the child before exec.

The kernel sends the signal when the *thread* that forked the child exits, so the launcher
spawns from its event-loop thread (the main thread for `lab up` and `lab sweep`). A child whose
parent already died between fork and prctl kills itself at once.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
from collections.abc import Callable
from typing import Literal

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
