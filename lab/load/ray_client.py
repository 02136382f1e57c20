"""The load client's processes as Ray async actors, spread over a cluster's nodes (`lab sweep
--ray`; docs/ray.md).

What a level does with them is what it does with `--client-procs` processes (`lab.load.client`,
`lab.open_loop.client`), with the cluster in place of one machine:

- One actor per placement-group bundle (SPREAD or STRICT_SPREAD), created once per sweep. A
  closed-loop level's concurrency is split over the actors by `split_share`, as over client
  processes; with no counter shared across nodes, each actor claims its own share of the
  request indices (`share_indices`: its slots' share of every round). An open-loop level's
  schedule is split into independent streams (`split_streams`), about rate/N each.
- Clocks: every stamp is the node's `perf_counter_ns()`. Before each level the driver pings
  each actor (NTP-style): the ping with the smallest round trip gives the actor's offset,
  `remote - (t0 + t1) / 2`, within +-rtt/2. The actor starts at the driver's start time on its
  own clock, and every stamp it returns is moved onto the driver's clock by its offset; each
  client info carries `clock_offset_ns` and `clock_error_ns`.
- Records stream back in batches (an async generator method: a Ray streaming generator), so
  an actor lost with its node loses only what it had not sent. Its other requests of the level
  become records with `error_kind` "client_lost" and the reason; the level still reports, and
  the next levels run on the actors that remain.

Ray is imported only here (and only when `--ray` is given): `pip install 'loadlab[ray]'`.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lab.load.client import (
    PROGRESS_INTERVAL_S,
    START_DELAY_NS,
    LevelProgress,
    ShareIndices,
    _Driver,
    _Payloads,
    build_record,
    share_indices,
    split_share,
)
from lab.load.client_settings import ClientSettings
from lab.load.ray_settings import RaySettings
from lab.load.record import RECORD_FIELDS, RequestRecord, Sent
from lab.load.sse import RawResponse
from lab.open_loop.client import _OpenDriver
from lab.shared.ray_connect import ClockOffset, RayConnectError, connect, measure_offset

#: An actor sends the records it finished at least this often.
BATCH_INTERVAL_S = PROGRESS_INTERVAL_S
#: What a lost actor's unanswered requests are recorded as.
LOST_KIND = "client_lost"
#: Calls an actor runs at once: a level's generator plus the driver's clock pings.
ACTOR_MAX_CALLS = 64
_STRATEGY = {"spread": "SPREAD", "strict-spread": "STRICT_SPREAD"}


class RayClientError(RuntimeError):
    """The Ray client could not start (no cluster, no room for its actors)."""


#: The record's stamps on the clock of the process that took them (`*_ns`, lab.load.record).
STAMP_FIELDS = tuple(name for name in RECORD_FIELDS if name.endswith("_ns"))


def shift_record(rec: RequestRecord, offset_ns: int) -> None:
    """Move a record's node-clock stamps onto the driver's clock (in place)."""
    for key in STAMP_FIELDS:
        value = getattr(rec, key)
        if isinstance(value, int):
            setattr(rec, key, value - offset_ns)
        elif isinstance(value, list):
            setattr(rec, key, [v - offset_ns for v in value])


class LoadClientActor:
    """One client node's share of each level (a Ray async actor; `ray.remote` wraps it in
    `RayClientPool`, so importing this module does not need Ray)."""

    def clock(self) -> int:
        return time.perf_counter_ns()

    def where(self) -> dict[str, Any]:
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(),
                "host": socket.gethostname(), "pid": os.getpid()}

    async def closed(self, url: str, payloads: _Payloads, share: int, first: int,
                     concurrency: int, warmup: int, options: ClientSettings, proc: int,
                     start_ns: int) -> AsyncIterator[dict]:
        indices = ShareIndices(payloads.n, concurrency, first, share)
        driver = _Driver(url, payloads, share, warmup, options, proc=proc, indices=indices)
        deadline = start_ns + int(options.duration_s * 1e9) if options.duration_s else None
        async for batch in _batches(driver, driver.run(start_ns=start_ns, deadline_ns=deadline)):
            yield batch

    async def open(self, url: str, payloads: _Payloads, indices: np.ndarray,
                   offsets: np.ndarray, warmup: int, options: ClientSettings, cap: int | None,
                   proc: int, start_ns: int) -> AsyncIterator[dict]:
        driver = _OpenDriver(url, payloads, indices, offsets, warmup, options, cap, proc)
        async for batch in _batches(driver, driver.run(start_ns=start_ns)):
            yield batch


def _claimed(driver: _Driver | _OpenDriver) -> int:
    """How many of its indices the driver has taken (sent or sending), in order."""
    return driver._next if isinstance(driver, _Driver) else len(driver.indices)


async def _batches(driver: _Driver | _OpenDriver, run: Any) -> AsyncIterator[dict]:
    """Run the driver; every BATCH_INTERVAL_S yield the records it finished since the last
    batch, then the rest with its client info."""
    task = asyncio.ensure_future(run)
    sent = 0
    try:
        while not task.done():
            await asyncio.wait([task], timeout=BATCH_INTERVAL_S)
            records = driver.records[sent:]
            sent += len(records)
            yield {"records": records, "done": driver.done, "errors": driver.errors,
                   "claimed": _claimed(driver)}
        info = task.result()
        yield {"records": driver.records[sent:], "done": driver.done, "errors": driver.errors,
               "claimed": _claimed(driver), "info": info}
    finally:
        if not task.done():
            task.cancel()


@dataclass
class _Member:
    actor: Any
    bundle: int
    where: dict[str, Any]
    alive: bool = True
    lost: str | None = None


@dataclass
class _Share:
    """One actor's part of a level, as the driver tracks it."""

    member: _Member
    proc: int
    indices: Sequence[int]
    clock: ClockOffset
    warmup: int
    prefix: str
    claimed: int = 0
    received: set[int] = field(default_factory=set)
    records: list[RequestRecord] = field(default_factory=list)
    info: dict | None = None
    done: int = 0
    errors: int = 0
    lost: str | None = None


class RayClientPool:
    """The sweep's client actors on a Ray cluster: `closed` and `open` run one level's share
    on each (what `lab.load.client.run_level` and `lab.open_loop.client.run_rate_level` do with
    local processes), `placement()` says where each runs, `close()` frees the cluster."""

    def __init__(self, settings: RaySettings) -> None:
        self.settings = settings
        self.members: list[_Member] = []
        self.pg: Any = None
        self.levels: list[dict] = []  # per level: each actor's node, offset and error bound
        self._started_ray = False

    # ----- life cycle -----

    def start(self) -> None:
        """Connect to the cluster and start the actors (blocking: call before the sweep's
        event loop, or in a thread)."""
        try:
            self._started_ray = connect(str(self.settings.ray))
        except RayConnectError as exc:
            raise RayClientError(str(exc)) from None
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        s = self.settings
        count = s.ray_client_nodes or len([n for n in ray.nodes() if n.get("Alive")])
        bundle: dict[str, float] = {"CPU": s.ray_client_cpus}
        if s.ray_client_resource:
            bundle[s.ray_client_resource] = 1.0
        self.pg = placement_group([dict(bundle) for _ in range(count)],
                                  strategy=_STRATEGY[s.ray_spread], name="loadlab-client")
        ready = self.pg.ready()
        done, _ = ray.wait([ready], timeout=s.ray_connect_timeout)
        if not done:
            raise RayClientError(
                f"--ray {s.ray}: no room for {count} client actors of {bundle} "
                f"({s.ray_spread}) within {s.ray_connect_timeout:g} s "
                f"(--ray-client-nodes, --ray-client-cpus, --ray-client-resource)")
        actor_cls = ray.remote(LoadClientActor)
        for k in range(count):
            strategy = PlacementGroupSchedulingStrategy(placement_group=self.pg,
                                                        placement_group_bundle_index=k)
            actor = actor_cls.options(num_cpus=s.ray_client_cpus,
                                      max_concurrency=ACTOR_MAX_CALLS,
                                      scheduling_strategy=strategy,
                                      name=f"loadlab-client-{k}").remote()
            self.members.append(_Member(actor, k, {}))
        try:
            wheres = ray.get([m.actor.where.remote() for m in self.members],
                             timeout=s.ray_connect_timeout)
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayError) as exc:
            raise RayClientError(f"--ray {s.ray}: the client actors did not start: "
                                 f"{exc}") from None
        for m, w in zip(self.members, wheres, strict=True):
            m.where = w

    def close(self) -> None:
        import ray

        for m in self.members:
            if m.alive:
                try:
                    ray.kill(m.actor)
                except Exception:  # already gone with its node
                    pass
        self.members.clear()
        if self.pg is not None:
            from ray.util.placement_group import remove_placement_group

            try:
                remove_placement_group(self.pg)
            except Exception:  # the cluster is gone
                pass
            self.pg = None
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False

    def __enter__(self) -> RayClientPool:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def placement(self) -> list[dict]:
        """Each actor's bundle and node, and whether it is still alive."""
        return [{"actor": k, "bundle": m.bundle, **m.where, "alive": m.alive, "lost": m.lost}
                for k, m in enumerate(self.members)]

    def alive(self) -> list[_Member]:
        members = [m for m in self.members if m.alive]
        if not members:
            raise RuntimeError("every Ray client actor was lost: " + "; ".join(
                str(m.lost) for m in self.members))
        return members

    # ----- clocks -----

    async def clock_offset(self, actor: Any) -> ClockOffset:
        """NTP-style: the offset of the ping with the smallest round trip, within rtt/2."""
        return await measure_offset(lambda: actor.clock.remote(), self.settings.ray_clock_pings)

    # ----- one level -----

    async def closed(self, url: str, payloads: _Payloads, concurrency: int, warmup: int,
                     options: ClientSettings, progress: Callable[[LevelProgress], None] | None
                     ) -> tuple[list[RequestRecord], list[dict]]:
        """A closed-loop level: `concurrency` split over the actors, each on its own share of
        the indices."""
        members = self.alive()
        shares = split_share(concurrency, len(members))
        index_sets = share_indices(payloads.n, concurrency, len(members))
        clocks = [await self.clock_offset(m.actor) for m in members[:len(shares)]]
        parts = [_Share(m, k, idx, c, warmup, options.request_id_prefix) for k, (m, idx, c)
                 in enumerate(zip(members, index_sets, clocks, strict=False))]
        start_ns = time.perf_counter_ns() + START_DELAY_NS

        def call(part: _Share, ref: Any) -> Any:
            return part.member.actor.closed.remote(
                url, ref, shares[part.proc], index_sets[part.proc].first, concurrency, warmup,
                options, part.proc, start_ns + part.clock.offset_ns)

        total = None if options.duration_s else payloads.n
        return await self._level(parts, payloads, call, total, progress)

    async def open(self, url: str, payloads: _Payloads, offsets: np.ndarray, warmup: int,
                   options: ClientSettings, cap: int | None, streams: np.ndarray,
                   progress: Callable[[LevelProgress], None] | None
                   ) -> tuple[list[RequestRecord], list[dict]]:
        """An open-loop level: stream k of `streams` (`split_streams` over the actors) on
        actor k, at the same intended times on the driver's clock."""
        members = self.alive()
        n = len(members)
        caps = split_share(cap, n) if cap is not None else [None] * n
        clocks = [await self.clock_offset(m.actor) for m in members]
        mine = [np.flatnonzero(streams == k) for k in range(n)]
        parts = [_Share(m, k, [int(i) for i in mine[k]], clocks[k], warmup,
                        options.request_id_prefix) for k, m in enumerate(members)]
        start_ns = time.perf_counter_ns() + START_DELAY_NS

        def call(part: _Share, ref: Any) -> Any:
            idx = mine[part.proc]
            return part.member.actor.open.remote(
                url, ref, idx, offsets[idx], warmup,
                options.model_copy(update=dict(client_procs=1)),
                caps[part.proc], part.proc, start_ns + part.clock.offset_ns)

        return await self._level(parts, payloads, call, len(offsets), progress)

    def streams_for(self) -> int:
        """How many streams an open-loop level is split into: one per live actor."""
        return len(self.alive())

    async def _level(self, parts: list[_Share], payloads: _Payloads,
                     call: Callable[[_Share, Any], Any], total: int | None,
                     progress: Callable[[LevelProgress], None] | None
                     ) -> tuple[list[RequestRecord], list[dict]]:
        import ray

        ref = ray.put(payloads)
        started = time.perf_counter_ns()

        async def consume(part: _Share) -> None:
            try:
                async for batch_ref in call(part, ref):
                    batch = await batch_ref
                    for rec in batch["records"]:
                        shift_record(rec, part.clock.offset_ns)
                        part.received.add(rec.index)
                    part.records.extend(batch["records"])
                    part.done, part.errors = batch["done"], batch["errors"]
                    part.claimed = batch["claimed"]
                    if "info" in batch:
                        part.info = batch["info"]
            except ray.exceptions.RayError as exc:
                where = part.member.where
                part.lost = (f"client actor {part.proc} on node {where.get('node_id', '?')[:12]} "
                             f"({where.get('host', '?')}) lost: {type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''}")
                part.member.alive = False
                part.member.lost = part.lost

        async def report() -> None:
            while True:
                await asyncio.sleep(PROGRESS_INTERVAL_S)
                if progress:
                    progress(LevelProgress(sum(p.done for p in parts), total,
                                      sum(p.errors for p in parts),
                                      (time.perf_counter_ns() - started) / 1e9))

        async with asyncio.TaskGroup() as tg:
            reporter = tg.create_task(report())
            async with asyncio.TaskGroup() as level:
                for part in parts:
                    level.create_task(consume(part))
            reporter.cancel()
        now = time.perf_counter_ns()
        records: list[RequestRecord] = []
        infos: list[dict] = []
        for part in parts:
            records.extend(part.records)
            if part.lost is not None:
                records.extend(_lost(part, payloads, now, counted=total is not None))
            if part.info is not None:
                info = {**part.info, "started_ns": part.info["started_ns"] - part.clock.offset_ns,
                        "ended_ns": part.info["ended_ns"] - part.clock.offset_ns}
            else:  # lost before it could say: its window is the level's, its CPU unknown
                info = {"proc": part.proc, "started_ns": started, "ended_ns": now, "cpu_s": 0.0,
                        "requests": len(part.records), "loop_lags_ns": []}
            info.update(clock_offset_ns=part.clock.offset_ns, clock_error_ns=part.clock.error_ns,
                        node_id=part.member.where.get("node_id"), lost=part.lost)
            infos.append(info)
        self.levels.append({"actors": [
            {"actor": p.proc, "node_id": p.member.where.get("node_id"),
             "host": p.member.where.get("host"), "clock_offset_ns": p.clock.offset_ns,
             "clock_error_ns": p.clock.error_ns, "lost": p.lost} for p in parts]})
        return records, infos


def _lost(part: _Share, payloads: _Payloads, now: int, *, counted: bool
          ) -> list[RequestRecord]:
    """A lost actor's requests of the level that never came back, as failed records: in a
    counted level all of its share (sent or not, the level planned them), in a timed one those
    it had claimed by its last batch."""
    indices = part.indices if counted else part.indices[:part.claimed]
    out = []
    for i in indices:
        if i in part.received:
            continue
        _, isl, osl, streaming = payloads.get(i)
        raw = RawResponse(sent_ns=now, done_ns=now, error_kind=LOST_KIND,
                          error_message=part.lost)
        sent = Sent(i, None, now, isl, osl, streaming)
        out.append(build_record(raw, sent, prefix=part.prefix, warmup=i < part.warmup,
                                proc=part.proc))
    return out
