"""`lab bench-discovery`: what etcd discovery costs per worker, for docs/scale.md.

One local etcd (launch.etcd.LocalEtcd), one writer that plays N sidecars (it registers N
records, then refreshes them round-robin with a new load sample each, as each sidecar's
heartbeat does once a `--heartbeat` while its engine is busy), and one watcher that follows the
prefix as a frontend does: `EtcdRegistry.watch_changes` applied to a `WorkerSet` (the set the
router reads; its request-plane clients are stand-ins that open no socket). The watcher runs in
a thread of its own, so that its CPU time is its own (the thread's CPU clock); etcd's is read
from its process. A last phase refreshes records with nothing changed (an idle sidecar's
heartbeat: a lease keepalive only) and measures what that costs the writer, etcd and the watcher.

Printed per N: CPU µs per event of the watcher, the writer and etcd, and etcd's RSS. A frontend
receives N / heartbeat events a second, each costing the watcher its per-event figure: the
watcher's CPU share is N x that / heartbeat. Figures are CPU time, not wall time, but a loaded
machine still inflates them (caches, frequency): state the load average beside them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import threading
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import cast

import click
import psutil

from lab.serve.discovery import Changes, WorkerRecord
from lab.serve.discovery.etcd_store import EtcdRegistry
from lab.serve.frontend.workers import WorkerSet
from lab.shared.config_cli import Settings, options, setting
from lab.shared.settings import SocketSettings
from launch.etcd import LocalEtcd

#: The most workers one round registers.
MAX_WORKERS = 100_000
MAX_EVENTS = 1_000_000
_DONE = "done"
#: The bench's lease TTL: long, so that no record expires while one writer plays N sidecars
#: (it refreshes each far less often than a sidecar would); the TTL does not change what a
#: watch event costs.
_LEASE_TTL_S = 3600.0


def parse_counts(value: str) -> tuple[int, ...]:
    """'10,100,1000' -> (10, 100, 1000); ValueError saying what is wrong otherwise."""
    try:
        counts = tuple(int(v) for v in str(value).split(","))
    except ValueError:
        raise ValueError(f"{value!r}: expected comma-separated integers, e.g. 10,100,1000"
                         ) from None
    if not counts or any(not 1 <= n <= MAX_WORKERS for n in counts):
        raise ValueError(f"{value!r}: each count must be within 1..{MAX_WORKERS}")
    return counts


class DiscoveryBenchSettings(Settings):
    """How many workers, how many refresh events each round measures."""

    workers: tuple[int, ...] = setting(
        (10, 100, 1000), "Registered workers of each round, comma-separated.",
        parse=parse_counts, format=lambda v: [",".join(map(str, v))], metavar="N,N,...")
    events: int = setting(
        300, "Record refreshes (watch events) measured per round, after the registrations.",
        ge=1, le=MAX_EVENTS)


@dataclass(frozen=True)
class Round:
    """One round's CPU µs per event (register: the N registrations; refresh: the heartbeats)."""

    workers: int
    register_watcher_us: float
    refresh_watcher_us: float
    refresh_writer_us: float
    refresh_etcd_us: float
    etcd_rss_mb: float
    messages: int
    unchanged_watcher_us: float  # per unchanged refresh (a keepalive): the watcher's CPU
    unchanged_writer_us: float
    unchanged_etcd_us: float


class _NoClient:
    """The bench's stand-in for a request-plane client: the watcher opens no socket."""

    def __init__(self, address: str, settings: SocketSettings) -> None:
        self.address = address

    async def close(self) -> None:
        return None


class _Watcher(threading.Thread):
    """A frontend's watch on its own thread and event loop; `ready` is set each time the live
    set satisfies `until` (a cheap test of the set just yielded)."""

    def __init__(self, url: str, prefix: str) -> None:
        super().__init__(name=f"watch{prefix}", daemon=True)
        self.registry = EtcdRegistry(url, prefix=prefix)
        self.workers = WorkerSet(self.registry, SocketSettings(),
                                 client_factory=_NoClient)  # type: ignore[arg-type]
        self.until: tuple[str, int] = ("count", 0)
        self.ready = threading.Event()
        self.messages = 0
        self._quit = threading.Event()
        self.clock: int | None = None
        self.started_clock = threading.Event()

    def cpu_s(self) -> float:
        assert self.clock is not None
        return time.clock_gettime(self.clock)

    def run(self) -> None:
        self.clock = time.pthread_getcpuclockid(threading.get_ident())
        self.started_clock.set()
        asyncio.run(self._follow())

    async def _follow(self) -> None:
        watch = cast(AsyncGenerator[Changes, None], self.registry.watch_changes())
        async with contextlib.aclosing(watch) as steps:
            async for changes in steps:
                self.messages += 1
                await self.workers.apply_changes(changes)
                kind, want = self.until
                if (kind == "count" and self.workers.counts()["aggregated"] == want) or (
                        kind == _DONE and any(r.load.get(_DONE) == want
                                              for r in changes.records)):
                    self.ready.set()
                if self._quit.is_set():
                    break
        await self.workers.close()
        await self.registry.close()

    def stop(self) -> None:
        self._quit.set()


def _record(i: int, load: dict[str, int] | None = None) -> WorkerRecord:
    return WorkerRecord(worker_id=f"sidecar-{i:06d}", role="aggregated",
                        address=f"127.0.0.1:{10000 + i % 50000}", model="mocker-model",
                        context_length=8192, kv_block_size=32, total_kv_blocks=4096,
                        max_running_requests=256, instance_id=f"engine-{i}",
                        load=load or {"active": 0, "waiting": 0, "kv_used": 0},
                        pid=os.getpid(), updated_at=time.time())


def _etcd_cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def _refreshed(n: int, k: int) -> int:
    """The worker the k-th refresh renews: round-robin over all but worker 0 (the marker's)."""
    return 1 + k % (n - 1) if n > 1 else 0


async def _measure(url: str, etcd: psutil.Process, n: int, events: int) -> Round:
    prefix = f"/bench-{n}-{time.monotonic_ns()}/"
    writer = EtcdRegistry(url, prefix=prefix, ttl_s=_LEASE_TTL_S)
    watcher = _Watcher(url, prefix)
    watcher.start()
    await asyncio.to_thread(watcher.started_clock.wait)
    try:
        watcher.until = ("count", n)
        latest = [_record(i) for i in range(n)]  # each worker's record as last published
        w0 = watcher.cpu_s()
        for record in latest:
            await writer.register(record)
        await asyncio.to_thread(watcher.ready.wait)
        register_w = watcher.cpu_s() - w0
        # Refreshes with a new load sample each (a busy sidecar's heartbeat).
        watcher.ready.clear()
        watcher.until = (_DONE, 1)
        w0, e0, m0 = watcher.cpu_s(), _etcd_cpu(etcd), time.thread_time()
        for k in range(events - 1):
            i = _refreshed(n, k)
            latest[i] = _record(i, {"active": k % 7, "waiting": 0, "kv_used": k})
            await writer.refresh(latest[i])
        await writer.refresh(_record(0, {_DONE: 1}))
        writer_s = time.thread_time() - m0
        await asyncio.to_thread(watcher.ready.wait)
        refresh_w, etcd_s = watcher.cpu_s() - w0, _etcd_cpu(etcd) - e0
        rss = etcd.memory_info().rss / 1e6
        # Refreshes that change nothing (an idle sidecar's heartbeat: a keepalive). The marker
        # after them is a change, so when the watcher sees it, it has seen all before it.
        watcher.ready.clear()
        watcher.until = (_DONE, 2)
        w0, e0, m0 = watcher.cpu_s(), _etcd_cpu(etcd), time.thread_time()
        for k in range(events):
            await writer.refresh(latest[_refreshed(n, k)])
        unchanged_writer_s = time.thread_time() - m0
        await writer.refresh(_record(0, {_DONE: 2}))
        await asyncio.to_thread(watcher.ready.wait)
        unchanged_w, unchanged_etcd_s = watcher.cpu_s() - w0, _etcd_cpu(etcd) - e0
    finally:
        watcher.stop()
        await writer.close()  # revokes the leases: the records vanish, the watcher wakes
        await asyncio.to_thread(watcher.join, 30)
    per_event = 1e6 / events
    return Round(n, register_w / n * 1e6, refresh_w * per_event, writer_s * per_event,
                 etcd_s * per_event, rss, watcher.messages, unchanged_w * per_event,
                 unchanged_writer_s * per_event, unchanged_etcd_s * per_event)


async def run(settings: DiscoveryBenchSettings) -> list[Round]:
    with tempfile.TemporaryDirectory(prefix="bench-discovery-") as tmp:
        async with LocalEtcd(tmp) as etcd:
            assert etcd.pid is not None
            proc = psutil.Process(etcd.pid)
            return [await _measure(etcd.client_url, proc, n, settings.events)
                    for n in settings.workers]


@click.command(name="bench-discovery")
@options(DiscoveryBenchSettings)
def bench_discovery(settings: DiscoveryBenchSettings) -> None:
    """Measure etcd discovery's CPU per event (watcher, writer, etcd) at N registered workers."""
    rounds = asyncio.run(run(settings))
    click.echo(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs; "
               f"{settings.events} refreshes per round")
    click.echo("| workers | watcher µs/registration | watcher µs/refresh | writer µs/refresh "
               "| etcd µs/refresh | etcd RSS MB | watch messages | unchanged refresh: watcher "
               "/ writer / etcd µs |")
    click.echo("|---|---|---|---|---|---|---|---|")
    for r in rounds:
        click.echo(f"| {r.workers} | {r.register_watcher_us:.0f} | {r.refresh_watcher_us:.0f} | "
                   f"{r.refresh_writer_us:.0f} | {r.refresh_etcd_us:.0f} | {r.etcd_rss_mb:.0f} "
                   f"| {r.messages} | {r.unchanged_watcher_us:.0f} / {r.unchanged_writer_us:.0f} "
                   f"/ {r.unchanged_etcd_us:.0f} |")
