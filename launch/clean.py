"""`lab clean`: kill processes of runs whose supervisor died without tearing them down, and
remove the network namespaces and links of such runs (clean_network, via launch.netns).

Two sources, so neither a lost state.json nor a process started after the last state write
escapes: (1) every process carrying the launcher's environment markers (LAB_SUPERVISOR_PID /
LAB_SUPERVISOR_START) whose supervisor is gone; (2) the processes recorded in
results/*/state.json of runs whose supervisor is gone.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

import psutil

from launch.process import ENV_PROCESS, ENV_RUN_DIR, ENV_SUPERVISOR_PID, ENV_SUPERVISOR_START
from launch.rundir import RESULTS_DIR
from launch.state import read_state, same_process, supervisor_alive, write_state


def _kill_group_of(pid: int) -> None:
    """SIGKILL the process's group if it leads one (the launcher starts each in its own)."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def orphans_by_environment() -> list[dict[str, Any]]:
    found = []
    me = os.getpid()
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        if ENV_SUPERVISOR_PID not in env:
            continue
        try:
            sup_pid = int(env[ENV_SUPERVISOR_PID])
            sup_start = env.get(ENV_SUPERVISOR_START)
            sup_time = None if sup_start in (None, "None") else float(sup_start)
        except ValueError:
            continue
        if sup_pid == me or same_process(sup_pid, sup_time):
            continue
        found.append({"pid": proc.pid, "name": env.get(ENV_PROCESS, "?"),
                      "run_dir": env.get(ENV_RUN_DIR, "?")})
    return found


def leftovers_of(state: dict[str, Any]) -> list[dict[str, Any]]:
    """Recorded processes of a run that still live."""
    return [
        {"pid": p["pid"], "name": p["name"], "run_dir": state.get("run_dir", "?")}
        for p in state.get("processes", [])
        if same_process(p.get("pid"), p.get("create_time"))
    ]


def clean_leftovers(results: Path | None = None, dry_run: bool = False) -> list[str]:
    """Kill what is left of crashed runs; returns one line per killed process."""
    victims: dict[int, dict[str, Any]] = {v["pid"]: v for v in orphans_by_environment()}
    crashed: list[tuple[Path, dict[str, Any]]] = []
    base = RESULTS_DIR if results is None else results
    if base.is_dir():
        for state_path in sorted(base.rglob("state.json")):  # nested: e.g. nagle arms
            state = read_state(state_path.parent)
            if state is None or supervisor_alive(state):
                continue
            for victim in leftovers_of(state):
                victims.setdefault(victim["pid"], victim)
            if state.get("state") not in ("stopped", "failed", "crashed"):
                crashed.append((state_path.parent, state))
    lines = []
    for pid, victim in sorted(victims.items()):
        if not dry_run:
            _kill_group_of(pid)
        lines.append(f"{victim['name']} (pid {pid}) of {victim['run_dir']}")
    if not dry_run:
        for run_dir, state in crashed:
            state["state"] = "crashed"
            with contextlib.suppress(OSError):
                write_state(run_dir, state)
    return lines


def clean_network(dry_run: bool = False) -> list[str]:
    """Remove `llab*` namespaces, links and bridges whose run has no live launcher (processes
    still inside are killed first); returns one line per object. Runs of live launchers are
    never touched. Without root the leftovers are only listed, with the reason."""
    from launch import netns

    found = netns.find_leftovers()
    if not found:
        return []
    objects = [*(f"namespace {n}" for n in found.namespaces),
               *(f"link {n}" for n in found.links)]
    if found.pids:
        objects.append(f"processes {', '.join(map(str, sorted(found.pids)))} inside them")
    if dry_run:
        return [f"would remove {o}" for o in objects]
    if os.geteuid() != 0:
        return [f"cannot remove {o}: needs root" for o in objects]
    netns.clean_leftovers()
    return [f"removed {o}" for o in objects]
