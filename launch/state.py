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


def _stopped(pid: int | None) -> bool:
    try:
        return bool(pid) and psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _sidecar_of(name: str) -> str | None:
    return "sidecar" + name[len("engine"):] if name.startswith("engine") else None


def observed_states(state: dict[str, Any]) -> dict[str, str]:
    """name -> what the operating system and discovery see now, for processes the supervisor
    calls ready: `stopped (SIGSTOP)` (the process is stopped), `withdrawn` (a live sidecar whose
    record is not in the file registry: it took its worker out of rotation), `stalled` (an
    engine whose live sidecar withdrew: it answers but serves nothing). Processes not listed
    keep the supervisor's state. Discovery is checked for file registries only."""
    from launch.readiness import registry_dir

    procs = {p["name"]: p for p in state.get("processes", [])}
    directory = registry_dir(str(state.get("discovery") or ""))
    out: dict[str, str] = {}
    withdrawn: set[str] = set()
    for name, p in procs.items():
        if p.get("state") != "ready" or not same_process(p.get("pid"), p.get("create_time")):
            continue
        if _stopped(p.get("pid")):
            out[name] = "stopped (SIGSTOP)"
        elif p.get("role") == "sidecar" and directory is not None and not (
            directory / f"{name}.json"
        ).exists():
            out[name] = "withdrawn"
            withdrawn.add(name)
    for name, p in procs.items():
        if p.get("role") == "engine" and name not in out and _sidecar_of(name) in withdrawn:
            out[name] = "stalled"
    return out
