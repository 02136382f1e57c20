"""The registry interface, the worker record, and a watch's changes."""

from __future__ import annotations

import abc
import builtins
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class WorkerRecord:
    """One worker (one sidecar in front of one engine) as discovery stores it."""

    worker_id: str  # the sidecar's process name, e.g. "sidecar-decode-0"
    role: str  # "aggregated" | "prefill" | "decode"
    address: str  # request-plane "host:port"
    model: str
    context_length: int
    kv_block_size: int = 0
    total_kv_blocks: int = 0
    max_running_requests: int = 0
    instance_id: str = ""  # the engine's instance id
    load: dict[str, Any] = field(default_factory=dict)  # latest GetLoad sample (JSON form)
    pid: int = 0
    updated_at: float = 0.0  # wall-clock seconds of the last refresh

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WorkerRecord:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    def same_content(self, other: WorkerRecord) -> bool:
        """Equal but for `updated_at`: a heartbeat that only moves the clock is no change."""
        return all(
            getattr(self, name) == getattr(other, name) for name in _CONTENT_FIELDS
        )


#: The fields a change of which is a change of the record (all but the refresh clock).
_CONTENT_FIELDS = tuple(f.name for f in fields(WorkerRecord) if f.name != "updated_at")


@dataclass(frozen=True)
class Changes:
    """One step of `Registry.watch_changes`. `reset`: `records` is the whole live set (the
    first step, and again after a reconnect); otherwise `records` are the records added or
    changed since the last step and `removed` the worker ids that left. A consumer applies a
    step in time proportional to its size, not to the size of the set."""

    records: tuple[WorkerRecord, ...] = ()
    removed: tuple[str, ...] = ()
    reset: bool = False


class Registry(abc.ABC):
    """register / refresh / withdraw / list / watch. Records expire when not refreshed in ttl."""

    @abc.abstractmethod
    async def register(self, record: WorkerRecord) -> None: ...

    @abc.abstractmethod
    async def refresh(self, record: WorkerRecord) -> None:
        """Heartbeat: re-publish the record (its load sample may have changed)."""

    @abc.abstractmethod
    async def withdraw(self, worker_id: str) -> None: ...

    @abc.abstractmethod
    async def list(self) -> builtins.list[WorkerRecord]:
        """Live records only (expired ones are dropped)."""

    @abc.abstractmethod
    def watch(self) -> AsyncIterator[builtins.list[WorkerRecord]]:
        """Yield the current live set now, then again each time it changes."""

    async def watch_changes(self) -> AsyncIterator[Changes]:
        """The live set now (a reset), then each change as it happens (what the frontend
        follows). This default diffs the sets `watch()` yields, O(N) per change; a store that
        is told what changed (etcd) yields each change as it comes."""
        last: dict[str, WorkerRecord] | None = None
        async for records in self.watch():
            live = {r.worker_id: r for r in records}
            if last is None:
                yield Changes(tuple(records), reset=True)
            else:
                changed = tuple(
                    r for wid, r in live.items()
                    if (old := last.get(wid)) is None or not old.same_content(r)
                )
                removed = tuple(wid for wid in last if wid not in live)
                if changed or removed:
                    yield Changes(changed, removed)
            last = live

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (connections, leases)."""
