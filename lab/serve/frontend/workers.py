"""The frontend's view of the fleet: discovery records -> one `SidecarHandle` (a request-plane
client and the frontend's state) per worker's sidecar.

The watch loop applies each change the registry yields (`Registry.watch_changes`): new workers
get a RequestPlaneClient, changed records update the published load, workers that left discovery
stop receiving new requests at once but keep their client until their in-flight requests finish
(a sidecar that withdraws on SIGTERM keeps serving through its grace period); the janitor closes
idle retired clients. A change costs its own size: a new load sample replaces one handle's
record (what the router reads) in O(1); only a join or a leave rebuilds the per-role lists.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from lab.serve.discovery import Changes, Registry, WorkerRecord
from lab.serve.frontend.config import WORKER_BACKOFF_S
from lab.serve.request_plane.api import ClientFactory, PlaneClient
from lab.serve.router import Router
from lab.shared.settings import ROLES, SocketSettings

log = logging.getLogger("lab.frontend.workers")


# Retired clients still busy after this long are closed anyway (their streams fail).
RETIRE_MAX_S = 600.0


#: The legs of a request, by the roles that may serve them (`WorkerSet.pick`).
PREFILL = "prefill"
DECODE = "decode"
AGGREGATED = "aggregated"
LEG_ROLES: dict[str, tuple[str, ...]] = {
    PREFILL: ("prefill",),
    DECODE: ("decode",),
    AGGREGATED: ("aggregated", "decode"),
}
#: The roles that serve a request on their own (no prefill leg).
AGGREGATED_ROLES = LEG_ROLES[AGGREGATED]


def default_client_factory(address: str, settings: SocketSettings) -> PlaneClient:
    from lab.serve.request_plane import RequestPlaneClient

    return RequestPlaneClient(address, settings)


def unavailable_errors() -> tuple[type[BaseException], ...]:
    """Exceptions meaning "could not reach the worker" (safe to try another worker)."""
    from lab.serve.request_plane import WorkerUnavailable

    return (OSError, EOFError, WorkerUnavailable)


class SidecarHandle:
    """The frontend's handle on one registered worker's sidecar: its discovery record, its
    request-plane client, and the frontend's own state for it (requests in flight, backoff)."""

    __slots__ = ("client", "down_until", "inflight", "record", "retired_at", "role", "worker_id")

    def __init__(self, record: WorkerRecord, client: PlaneClient) -> None:
        self.record = record
        self.worker_id = record.worker_id
        self.role = record.role
        self.client = client
        self.inflight = 0
        self.down_until = 0.0
        self.retired_at: float | None = None

    @property
    def load(self) -> Mapping[str, Any]:
        return self.record.load

    def mark_down(self) -> None:
        self.down_until = time.monotonic() + WORKER_BACKOFF_S


class WorkerSet:
    def __init__(
        self,
        registry: Registry,
        settings: SocketSettings,
        client_factory: ClientFactory | None = None,
    ) -> None:
        self.registry = registry
        self.settings = settings
        self._factory = client_factory or default_client_factory
        self._workers: dict[str, SidecarHandle] = {}
        self._by_role: dict[str, list[SidecarHandle]] = {role: [] for role in ROLES}
        self._retired: list[SidecarHandle] = []
        self.synced = asyncio.Event()  # set after the first live set was applied

    # --- discovery -----------------------------------------------------------------------------

    async def watch(self) -> None:
        async for changes in self.registry.watch_changes():
            await self.apply_changes(changes)

    async def apply(self, records: Iterable[WorkerRecord]) -> None:
        """Make the live set `records` (a whole set: O(N))."""
        live: dict[str, WorkerRecord] = {r.worker_id: r for r in records}
        for worker_id, worker in list(self._workers.items()):
            record = live.get(worker_id)
            if record is None or not self._update(worker, record):
                self._retire(worker)
        for worker_id, record in live.items():
            if worker_id not in self._workers:
                self._join(record)
        self._rebuild_roles()
        self.synced.set()
        await self.close_idle()

    async def apply_changes(self, changes: Changes) -> None:
        """Apply one step of a watch: a reset is a whole set (`apply`); otherwise each record
        costs O(1), and the per-role lists are rebuilt only when a worker joined or left."""
        if changes.reset:
            await self.apply(changes.records)
            return
        membership = False
        for record in changes.records:
            worker = self._workers.get(record.worker_id)
            if worker is not None and self._update(worker, record):
                continue
            if worker is not None:
                self._retire(worker)
            self._join(record)
            membership = True
        for worker_id in changes.removed:
            worker = self._workers.get(worker_id)
            if worker is not None:
                self._retire(worker)
                membership = True
        if membership:
            self._rebuild_roles()
        self.synced.set()
        await self.close_idle()

    @staticmethod
    def _update(worker: SidecarHandle, record: WorkerRecord) -> bool:
        """Take a newer record of the same sidecar (same address and role); False when it is
        another sidecar under the same id (the old one retires, the new one joins)."""
        if record.address != worker.record.address or record.role != worker.role:
            return False
        worker.record = record
        return True

    def _join(self, record: WorkerRecord) -> None:
        if record.role not in self._by_role:
            log.warning("ignoring worker %s with unknown role %r", record.worker_id, record.role)
            return
        worker = SidecarHandle(record, self._factory(record.address, self.settings))
        self._workers[record.worker_id] = worker
        log.info(
            "worker joined: %s role=%s address=%s", record.worker_id, record.role, record.address
        )

    def _rebuild_roles(self) -> None:
        by_role: dict[str, list[SidecarHandle]] = {role: [] for role in ROLES}
        for worker in self._workers.values():
            by_role[worker.role].append(worker)
        self._by_role = by_role

    def _retire(self, worker: SidecarHandle) -> None:
        del self._workers[worker.worker_id]
        worker.retired_at = time.monotonic()
        self._retired.append(worker)
        log.info("worker left: %s (in flight %d)", worker.worker_id, worker.inflight)

    async def close_idle(self) -> None:
        """Close retired clients with nothing in flight (or retired too long ago)."""
        if not self._retired:
            return
        now = time.monotonic()
        done = [
            w
            for w in self._retired
            if w.inflight == 0 or now - (w.retired_at or now) > RETIRE_MAX_S
        ]
        if not done:
            return
        self._retired = [w for w in self._retired if w not in done]
        async with asyncio.TaskGroup() as tg:
            for worker in done:
                tg.create_task(_close(worker))

    async def janitor(self, interval_s: float = 1.0) -> None:
        while True:
            await asyncio.sleep(interval_s)
            await self.close_idle()

    async def close(self) -> None:
        workers = list(self._workers.values()) + self._retired
        self._workers.clear()
        self._retired.clear()
        self._by_role = {role: [] for role in ROLES}
        async with asyncio.TaskGroup() as tg:
            for worker in workers:
                tg.create_task(_close(worker))

    # --- queries -------------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        return {role: len(ws) for role, ws in self._by_role.items()}

    def all(self) -> list[SidecarHandle]:
        return list(self._workers.values())

    def context_length(self) -> int | None:
        """The largest context length any registered worker reports (None: no worker)."""
        lengths = [w.record.context_length for w in self._workers.values()]
        return max(lengths) if lengths else None

    def models(self) -> list[str]:
        return sorted({w.record.model for w in self._workers.values()})

    def roles_of(self, leg: str) -> str:
        """The roles that may serve `leg`, as an error message names them."""
        return "/".join(LEG_ROLES[leg])

    def pick(
        self,
        leg: str,
        router: Router,
        model: str | None,
        exclude: set[str],
    ) -> SidecarHandle | None:
        """Choose a sidecar for `leg` (PREFILL, DECODE or AGGREGATED) serving `model`
        (None = any), not in `exclude`. A prefill sidecar only while decode sidecars are
        registered too (without them the request goes aggregated).

        Sidecars whose connection failed recently are used only when no other is left.
        """
        by_role = self._by_role
        if leg == PREFILL and not by_role["decode"]:
            return None
        roles = LEG_ROLES[leg]
        if len(roles) == 1:
            pool = by_role[roles[0]]
        else:
            pool = [w for role in roles for w in by_role[role]]
        if model is not None:
            pool = [w for w in pool if w.record.model == model]
        if exclude:
            pool = [w for w in pool if w.worker_id not in exclude]
        if not pool:
            return None
        now = time.monotonic()
        healthy = [w for w in pool if w.down_until <= now]
        return router.choose(healthy or pool)


async def _close(worker: SidecarHandle) -> None:
    try:
        await worker.client.close()
    except Exception as exc:  # a failing close must not take the frontend down
        log.warning("closing the client of %s: %s", worker.worker_id, exc)
