"""Per-process CPU % and RSS every 0.5 s into procs.parquet (rewritten periodically and at exit).

cpu_pct is psutil's: 100 = one full core over the interval since the previous sample of that
pid (with `include_children`, plus its descendants', for servers that fork workers). pandas is
imported only when writing, in the launcher process (never in the fleet).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from launch.process import ProcessView

COLUMNS = ("t_ns", "wall", "name", "role", "pid", "cpu_pct", "rss_bytes")


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
        for view in self.views():
            if view.pid is None or view.state in ("exited", "stopped"):
                continue
            key = (view.pid, view.create_time)
            live_keys.add(key)
            proc = self._procs.get(key)
            try:
                if proc is None:
                    proc = psutil.Process(view.pid)
                    proc.cpu_percent(None)  # first call primes the counter
                    self._procs[key] = proc
                    continue
                with proc.oneshot():
                    cpu = proc.cpu_percent(None)
                    rss = proc.memory_info().rss
                if self.include_children:
                    extra_cpu, extra_rss = self._descendants(proc)
                    cpu += extra_cpu
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
                "rss_bytes": int(rss),
            })
        for key in set(self._procs) - live_keys:
            del self._procs[key]
        self.samples.extend(rows)
        return rows

    def _descendants(self, proc: psutil.Process) -> tuple[float, int]:
        """CPU % and RSS of a process's descendants (a child seen for the first time primes
        its counter and counts from the next sample)."""
        cpu, rss = 0.0, 0
        try:
            children = proc.children(recursive=True)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return cpu, rss
        for child in children:
            known = self._children.get(child.pid)
            try:
                if known is None or known.create_time() != child.create_time():
                    child.cpu_percent(None)
                    self._children[child.pid] = child
                    continue
                cpu += known.cpu_percent(None)
                rss += known.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                self._children.pop(child.pid, None)
        return cpu, rss

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
                              "cpu_pct": "float64", "rss_bytes": "int64"})
        tmp = self.path.with_suffix(".parquet.tmp")
        frame.to_parquet(tmp, index=False)
        tmp.replace(self.path)
        self._written = len(rows)
        return self.path
