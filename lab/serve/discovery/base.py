"""The registry interface and the worker record."""

from __future__ import annotations

import abc
import builtins
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
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

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (connections, leases)."""


def open_registry(spec: str, **options: Any) -> Registry:
    """`file:DIR` (the default store) or `etcd://HOST:PORT[/prefix]`. Raises ValueError naming
    the spec when it is not understood."""
    scheme, sep, rest = spec.partition(":")
    if scheme == "file" and sep and rest:
        from lab.serve.discovery.file_store import FileRegistry

        return FileRegistry(rest, **options)
    if scheme == "etcd" and sep:
        from lab.serve.discovery.etcd_store import EtcdRegistry

        return EtcdRegistry.from_spec(spec, **options)
    raise ValueError(f"--discovery {spec!r}: expected file:DIR or etcd://HOST:PORT[/prefix]")
