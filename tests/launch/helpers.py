"""Process helpers shared by the launcher tests."""

from __future__ import annotations

import psutil


def descendants() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def alive(pid: int, create_time: float | None = None) -> bool:
    """`pid` runs (not a zombie) and, if given, was created at `create_time` (no pid reuse)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return create_time is None or abs(proc.create_time() - create_time) < 0.05
    except psutil.NoSuchProcess:
        return False
