"""In-process fakes for testing the frontend without sidecars: a registry and worker clients.

`FakeFleet` is both the registry (the frontend watches it) and the client factory (the frontend
asks it for a request-plane client per worker address). Each fake worker answers a request with
a scripted behaviour: tokens in chunks, an END error, a prefill handoff, a stall, ... The frames
are the real ones: `FrameType` values, and END payloads with every key the sidecar sends
(`error_end` for errors, `done_end` below otherwise), so the frontend sees what it would see
from a sidecar.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, fields
from typing import Any

from lab.serve.discovery.base import Registry, WorkerRecord
from lab.serve.request_plane import FrameType, error_end
from lab.serve.request_plane.api import PlaneClient, PlaneStream
from lab.serve.request_plane.payloads import ChunkPayload, EndPayload, Usage, end_payload
from lab.shared.frontend_settings import FrontendSettings
from lab.shared.settings import DEFAULT_MODEL, SocketSettings

CHUNK, END = int(FrameType.CHUNK), int(FrameType.END)
#: (frame type, payload): the payload one of the request-plane TypedDicts (plain dicts at run time)
Frames = AsyncIterator[tuple[int, Any]]
Behavior = Callable[["FakeWorker", dict[str, Any]], Frames]


def done_end(worker: FakeWorker, usage: Usage, handoff: dict | None = None) -> EndPayload:
    """A successful END payload (finish "length"), built like the sidecar's."""
    return end_payload(finish="length", usage=usage, handoff=handoff, worker_id=worker.worker_id)


async def default_behavior(worker: FakeWorker, req: dict[str, Any]) -> Frames:
    """Prefill: END with a handoff. Otherwise max_tokens tokens (16 if None), `per_chunk` each."""
    prompt = req["token_ids"]
    usage: Usage = {"prompt_tokens": len(prompt), "completion_tokens": 0, "cached_tokens": 0}
    if worker.role == "prefill":
        usage["completion_tokens"] = 1
        usage["cached_tokens"] = worker.cached_tokens
        handoff = {
            "session_id": f"sess-{req['request_id']}",
            "transfer_backend": "FAKE",
            "endpoints": [],
            "dp_rank": 0,
            "attributes": {"first": 7},
        }
        yield END, done_end(worker, usage, handoff)
        return
    n = req["max_tokens"] if req["max_tokens"] is not None else 16
    sent = 0
    while sent < n:
        k = min(worker.per_chunk, n - sent)
        payload: ChunkPayload = {"t": [100 + sent + i for i in range(k)]}
        if req.get("logprobs"):
            payload["lp"] = [-0.5] * k
            if req.get("top_logprobs"):
                payload["top"] = [[[100 + sent + i, -0.5], [5, -1.5]] for i in range(k)]
        yield CHUNK, payload
        sent += k
        if worker.delay_s:
            await asyncio.sleep(worker.delay_s)
    usage["completion_tokens"] = n
    usage["cached_tokens"] = req.get("prefill_cached_tokens") or 0
    yield END, done_end(worker, usage)


def error_behavior(kind: str, status: int, after_tokens: int = 0) -> Behavior:
    """Send `after_tokens` tokens, then END with an error of `kind`."""

    async def behavior(worker: FakeWorker, req: dict[str, Any]) -> Frames:
        for i in range(after_tokens):
            yield CHUNK, {"t": [200 + i]}
        yield END, error_end(kind, f"fake {kind}", status, worker.worker_id)

    return behavior


def stall_behavior(tokens_first: int = 1) -> Behavior:
    """Send a few tokens, then never finish (until cancelled)."""

    async def behavior(worker: FakeWorker, req: dict[str, Any]) -> Frames:
        for i in range(tokens_first):
            yield CHUNK, {"t": [300 + i]}
        await asyncio.Event().wait()
        yield END, {}  # pragma: no cover

    return behavior


class FakeStream:
    """A PlaneStream over a behaviour's frames; `cancelled` is set when the frontend cancels."""

    def __init__(self, frames: Frames) -> None:
        self._frames = frames
        self.cancelled = asyncio.Event()
        self.direct: Callable[[dict[str, Any]], bool] | None = None  # never offered: all queued

    def __aiter__(self) -> Frames:
        return self._frames

    async def cancel(self) -> None:
        self.cancelled.set()


@dataclass
class FakeWorker:
    worker_id: str
    role: str = "aggregated"
    model: str = DEFAULT_MODEL
    per_chunk: int = 1
    delay_s: float = 0.0
    cached_tokens: int = 0
    refuse_connect: bool = False
    context_length: int = 32768
    behavior: Behavior = default_behavior
    load: dict[str, Any] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    streams: list[FakeStream] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"fake:{self.worker_id}"

    def record(self) -> WorkerRecord:
        """The worker as discovery lists it: the fields it shares with WorkerRecord."""
        mine = {f.name: getattr(self, f.name) for f in fields(self)}
        return WorkerRecord.from_json({**mine, "address": self.address, "load": dict(self.load)})


class FakeClient:
    """A PlaneClient for one fake worker's address."""

    def __init__(self, fleet: FakeFleet, address: str, settings: SocketSettings) -> None:
        self.fleet = fleet
        self.address = address
        self.settings = settings
        self.closed = False

    async def open_stream(self, request: dict[str, Any]) -> FakeStream:
        worker = self.fleet.by_address[self.address]
        if worker.refuse_connect or self.closed:
            raise ConnectionRefusedError(f"fake worker {worker.worker_id} refuses connections")
        worker.requests.append(dict(request))
        stream = FakeStream(worker.behavior(worker, request))
        worker.streams.append(stream)
        return stream

    async def close(self) -> None:
        self.closed = True


class FakeFleet(Registry):
    """An in-memory registry plus the client factory for its fake workers."""

    def __init__(self, *workers: FakeWorker) -> None:
        self.workers: dict[str, FakeWorker] = {}
        self.by_address: dict[str, FakeWorker] = {}
        self.clients: list[FakeClient] = []
        self._changed = asyncio.Event()
        self._version = 0
        for worker in workers:
            self.add(worker)

    # fleet control
    def add(self, worker: FakeWorker) -> FakeWorker:
        self.workers[worker.worker_id] = worker
        self.by_address[worker.address] = worker
        self._bump()
        return worker

    def remove(self, worker_id: str) -> None:
        self.workers.pop(worker_id, None)
        self._bump()

    def _bump(self) -> None:
        self._version += 1
        self._changed.set()

    def client_factory(self, address: str, settings: SocketSettings) -> FakeClient:
        client = FakeClient(self, address, settings)
        self.clients.append(client)
        return client

    # Registry
    async def register(self, record: WorkerRecord) -> None:  # pragma: no cover - unused
        raise NotImplementedError

    async def refresh(self, record: WorkerRecord) -> None:  # pragma: no cover - unused
        raise NotImplementedError

    async def withdraw(self, worker_id: str) -> None:
        self.remove(worker_id)

    async def list(self) -> builtins.list[WorkerRecord]:
        return [w.record() for w in self.workers.values()]

    async def watch(self) -> AsyncIterator[builtins.list[WorkerRecord]]:
        while True:
            self._changed.clear()
            yield await self.list()
            await self._changed.wait()


def fleet_settings(**options: Any) -> FrontendSettings:
    """A frontend's settings for a server given a FakeFleet as its registry (its `discovery` is
    never opened)."""
    return FrontendSettings(discovery="file:unused-the-fleet-is-the-registry", **options)


def _conforms(client: FakeClient, stream: FakeStream) -> tuple[PlaneClient, PlaneStream]:
    """Never called: mypy (which checks this file) holds the fakes to the frontend's Protocols."""
    return client, stream
