"""Sample an external target's processes (`--server-pid NAME=PID`) while a sweep runs.

Each named process is sampled with its children (launch.sampler: CPU %, CPU wait %, RSS), a
descendant under its nearest named ancestor, into RUN/procs.parquet; the sweep's levels read
the samples (lab.analysis.metrics `process_figures`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any


@contextlib.asynccontextmanager
async def sampling_servers(run_dir: Path, server_pids: dict[str, int]
                           ) -> AsyncIterator[Callable[[], list[dict[str, Any]]] | None]:
    """While the body runs, sample `server_pids` into run_dir/procs.parquet; yields the
    sampler's `samples_now` for the sweep runner (None, and nothing sampled, without pids)."""
    if not server_pids:
        yield None
        return
    import psutil

    from launch.process import ProcessView
    from launch.sampler import Sampler

    views = [ProcessView(name, "server", None, pid, None, "ready", 0,
                         create_time=psutil.Process(pid).create_time())
             for name, pid in server_pids.items()]
    sampler = Sampler(lambda: views, run_dir / "procs.parquet", include_children=True)
    async with asyncio.TaskGroup() as tg:
        sampling = tg.create_task(sampler.run())
        try:
            yield sampler.samples_now
        finally:
            sampling.cancel()
    sampler.sample_once()
    await asyncio.to_thread(sampler.write)
