"""grpc.health.v1 for the mocker: Check and Watch, settable per service name, and a graceful
shutdown that sets every service NOT_SERVING and then ends every Watch stream (the stock aio
servicer keeps Watch streams open until the server cancels them, after the grace period; the
sidecar must see the stream end at once).
"""

from __future__ import annotations

import asyncio

import grpc

from .pb import health_pb2, health_pb2_grpc

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN

_END = object()


class HealthServicer(health_pb2_grpc.HealthServicer):
    def __init__(self, services: tuple[str, ...], status: int = NOT_SERVING) -> None:
        self._status: dict[str, int] = {s: status for s in services}
        self._watchers: dict[str, set[asyncio.Queue]] = {}
        self._shutting_down = False

    def status(self, service: str) -> int | None:
        return self._status.get(service)

    def set(self, service: str, status: int) -> None:
        """Set one service's status (ignored once shutting down) and notify its watchers."""
        if self._shutting_down:
            return
        self._set(service, status)

    def _set(self, service: str, status: int) -> None:
        self._status[service] = status
        for q in self._watchers.get(service, ()):
            q.put_nowait(status)

    def set_all(self, status: int) -> None:
        for service in list(self._status):
            self.set(service, status)

    def enter_graceful_shutdown(self) -> None:
        """Every service NOT_SERVING (liveness first), then end all Watch streams."""
        if self._shutting_down:
            return
        self._shutting_down = True
        for service in sorted(self._status, key=lambda s: s != "liveness"):
            self._set(service, NOT_SERVING)
        for queues in self._watchers.values():
            for q in queues:
                q.put_nowait(_END)

    async def Check(self, request, context):
        status = self._status.get(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request, context):
        service = request.service
        q: asyncio.Queue = asyncio.Queue()
        self._watchers.setdefault(service, set()).add(q)
        try:
            last = self._status.get(service, SERVICE_UNKNOWN)
            yield health_pb2.HealthCheckResponse(status=last)
            if self._shutting_down:
                return
            while True:
                item = await q.get()
                if item is _END:
                    return
                if item != last:
                    last = item
                    yield health_pb2.HealthCheckResponse(status=item)
        finally:
            watchers = self._watchers.get(service)
            if watchers is not None:
                watchers.discard(q)
                if not watchers:
                    del self._watchers[service]
