"""state.json: how `lab ps/down/fault/clean` find a run's supervisor and processes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import psutil

STATE_FILE = "state.json"


def write_state(run_dir: Path, state: dict[str, Any]) -> None:
    path = run_dir / STATE_FILE
    tmp = run_dir / f".{STATE_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(state, indent=2, default=str) + "\n")
    tmp.replace(path)


def read_state(run_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((run_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None


def same_process(pid: int | None, create_time: float | None) -> bool:
    """True if `pid` is alive (not a zombie) and is the process that was started then."""
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return create_time is None or abs(proc.create_time() - create_time) <= 0.05
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def supervisor_alive(state: dict[str, Any]) -> bool:
    return same_process(state.get("supervisor_pid"), state.get("supervisor_create_time"))
