"""Per-process CPU %, CPU wait % and RSS every 0.5 s into procs.parquet (rewritten periodically
and at exit).

cpu_pct is psutil's: 100 = one full core over the interval since the previous sample of that
pid (with `include_children`, plus its descendants', for servers that fork workers).
cpu_wait_pct is the time its threads were runnable but waited for a CPU (the kernel's run-queue
delay, /proc/PID/task/*/schedstat), on the same scale: a server beside the load client on a
small machine stretches its passes by that wait, which its own CPU time does not show. NaN where
the kernel does not publish it. pandas is imported only when writing, in the launcher process
(never in the fleet).

Nested named processes (vLLM: API server -> EngineCore -> Worker, each given with --server-pid):
a descendant's CPU counts once, under its nearest named ancestor, so the rows sum to the tree's
CPU and each row is its own part. Counting every descendant under every named ancestor would
count the Worker twice and the EngineCore inside the API server; and since one psutil counter
serves each descendant, the second reader would see the interval since the first read (~0).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from launch.process import ProcessView

COLUMNS = ("t_ns", "wall", "name", "role", "pid", "cpu_pct", "cpu_wait_pct", "rss_bytes")


def run_queue_wait_ns(pid: int) -> int | None:
    """Nanoseconds the process's live threads have waited on a run queue (the second field of
    each /proc/PID/task/TID/schedstat); None where it cannot be read. A thread that exited takes
    its share with it, so a delta over an interval can come out negative: clip it."""
    total, read = 0, False
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as fh:
                total += int(fh.read().split()[1])
            read = True
        except (OSError, IndexError, ValueError):
            continue
    return total if read else None


class _WaitMeter:
    """CPU wait % of one pid between calls: 100 = one thread waiting the whole interval."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[int, int]] = {}  # pid -> (perf_counter_ns, wait ns)

    def pct(self, pid: int) -> float | None:
        now, wait = time.perf_counter_ns(), run_queue_wait_ns(pid)
        last = self._last.get(pid)
        if wait is None:
            self._last.pop(pid, None)
            return None
        self._last[pid] = (now, wait)
        if last is None or now <= last[0]:
            return None
        return 100.0 * max(0, wait - last[1]) / (now - last[0])

    def forget(self, keep: set[int]) -> None:
        for pid in set(self._last) - keep:
            del self._last[pid]


class Sampler:
    def __init__(
        self,
        views: Callable[[], list[ProcessView]],
        path: Path,
        interval_s: float = 0.5,
        flush_every_s: float = 10.0,
        include_children: bool = False,
    ) -> None:
        self.views = views
        self.include_children = include_children
        self._children: dict[int, psutil.Process] = {}
        self.path = path
        self.interval_s = interval_s
        self.flush_every_s = flush_every_s
        self.samples: list[dict[str, Any]] = []
        self._procs: dict[tuple[int, float | None], psutil.Process] = {}
        self._waits = _WaitMeter()
        self._written = 0

    def samples_now(self) -> list[dict[str, Any]]:
        """Every sample so far, with one taken now: a sweep level shorter than the interval
        that just ended is then covered by a sample of its own (lab.analysis.metrics
        `process_figures` weights each sample by its interval's overlap with the level)."""
        self.sample_once()
        return list(self.samples)

    def sample_once(self) -> list[dict[str, Any]]:
        rows = []
        live_keys = set()
        views = [view for view in self.views()
                 if view.pid is not None and view.state not in ("exited", "stopped")]
        named = {view.pid for view in views if view.pid is not None}
        seen_children: set[int] = set()
        for view in views:
            assert view.pid is not None
            key = (view.pid, view.create_time)
            live_keys.add(key)
            proc = self._procs.get(key)
            try:
                if proc is None:
                    proc = psutil.Process(view.pid)
                    proc.cpu_percent(None)  # first call primes the counter
                    self._waits.pct(view.pid)
                    self._procs[key] = proc
                    continue
                with proc.oneshot():
                    cpu = proc.cpu_percent(None)
                    rss = proc.memory_info().rss
                wait = _nan(self._waits.pct(view.pid))
                if self.include_children:
                    extra_cpu, extra_wait, extra_rss = self._descendants(proc, named,
                                                                         seen_children)
                    cpu += extra_cpu
                    wait += extra_wait
                    rss += extra_rss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            rows.append({
                "t_ns": time.perf_counter_ns(),
                "wall": time.time(),
                "name": view.name,
                "role": view.role,
                "pid": view.pid,
                "cpu_pct": float(cpu),
                "cpu_wait_pct": float(wait),
                "rss_bytes": int(rss),
            })
        for key in set(self._procs) - live_keys:
            del self._procs[key]
        if self.include_children:
            for pid in set(self._children) - seen_children:
                del self._children[pid]
        self._waits.forget({pid for pid, _ in self._procs} | set(self._children))
        self.samples.extend(rows)
        return rows

    def _descendants(self, proc: psutil.Process, named: set[int],
                     seen: set[int]) -> tuple[float, float, int]:
        """CPU %, CPU wait % and RSS of the descendants of a process that have no nearer named
        ancestor (a named descendant is sampled as itself and carries its own subtree). A child
        seen for the first time primes its counters and counts from the next sample. Adds the
        pids kept to `seen` (the rest of the counters are dropped after the tick)."""
        cpu, wait, rss = 0.0, 0.0, 0
        try:
            children = proc.children(recursive=True)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return cpu, wait, rss
        parents: dict[int, int] = {}
        for child in children:
            with contextlib.suppress(psutil.Error):
                parents[child.pid] = child.ppid()
        for child in children:
            if not _owned_by(child.pid, proc.pid, parents, named):
                continue
            seen.add(child.pid)
            known = self._children.get(child.pid)
            try:
                if known is None or known.create_time() != child.create_time():
                    child.cpu_percent(None)
                    self._waits.pct(child.pid)
                    self._children[child.pid] = child
                    continue
                cpu += known.cpu_percent(None)
                wait += _nan(self._waits.pct(child.pid))
                rss += known.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                self._children.pop(child.pid, None)
        return cpu, wait, rss

    async def run(self) -> None:
        """Sample until cancelled; flush to parquet every flush_every_s (in a thread)."""
        last_flush = time.monotonic()
        while True:
            self.sample_once()
            if time.monotonic() - last_flush >= self.flush_every_s:
                last_flush = time.monotonic()
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self.write)
            await asyncio.sleep(self.interval_s)

    def write(self) -> Path:
        """(Re)write procs.parquet with every sample so far."""
        import pandas as pd

        rows = list(self.samples)
        frame = pd.DataFrame(rows, columns=list(COLUMNS))
        frame = frame.astype({"t_ns": "int64", "wall": "float64", "pid": "int64",
                              "cpu_pct": "float64", "cpu_wait_pct": "float64",
                              "rss_bytes": "int64"})
        tmp = self.path.with_suffix(".parquet.tmp")
        frame.to_parquet(tmp, index=False)
        tmp.replace(self.path)
        self._written = len(rows)
        return self.path


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


def _owned_by(pid: int, root: int, parents: dict[int, int], named: set[int]) -> bool:
    """Whether `root` is the nearest named ancestor of descendant `pid`: neither it nor any
    process between it and `root` is named. `parents` maps each descendant to its parent."""
    while pid != root:
        if pid in named:
            return False
        parent = parents.get(pid)
        if parent is None:  # its parent exited between the two reads: count it here
            return True
        pid = parent
    return True
