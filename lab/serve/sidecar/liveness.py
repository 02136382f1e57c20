"""Engine-loss detection: one path, many reasons (docs/architecture.md "Engine loss").

`EngineLoss` is the single place a loss is reported; the first reason wins. Three sources feed it:

* `watch_liveness()`: grpc.health.v1 Health/Watch for the service "liveness", on the engine
  link's one connection (the one that carries Generate). Any status other
  than SERVING (a first SERVICE_UNKNOWN included), the stream ending, the stream failing, or the
  stream not opening (no first status) within the connect-attempt timeout is a loss. NotFound or
  Unimplemented means the engine has no health service: one warning, no watch, no loss.
  Readiness ("inference") is deliberately not watched. A connection that died of its keepalive
  (an HTTP/2 PING unanswered: a frozen engine, whose TCP connection stays open) is no loss: the
  watch returns why, and the sidecar takes the worker out of rotation until the engine serves.
* `LoadMonitor`: no fresh GetLoad sample for `stale_s` while requests are active, or a GetLoad
  reporting another engine instance id.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from lab.wire.constants import HEALTH_LIVENESS
from lab.wire.h2grpc import KEEPALIVE_LOST, H2GrpcChannel

log = logging.getLogger(__name__)

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NO_HEALTH_SERVICE = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNIMPLEMENTED)


class EngineLoss:
    """Resolved once, with the first reason reported."""

    def __init__(self, instance_id: str = "") -> None:
        self.instance_id = instance_id
        self._future: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def report(self, reason: str) -> None:
        if not self._future.done():
            self._future.set_result(reason)

    @property
    def resolved(self) -> bool:
        return self._future.done()

    @property
    def reason(self) -> str | None:
        return self._future.result() if self._future.done() else None

    async def wait(self) -> str:
        return await asyncio.shield(self._future)

    def message(self) -> str:
        return f"engine lost: {self.reason} (instance {self.instance_id or 'unknown'})"


async def watch_liveness(
    channel: H2GrpcChannel,
    loss: EngineLoss,
    open_timeout_s: float,
    service: str = HEALTH_LIVENESS,
) -> str | None:
    """Follow Health/Watch(service) until a loss (reported to `loss`; returns None), no health
    service (returns None after one warning), or a keepalive timeout (returns its reason: the
    engine is frozen, not lost). Cancel to stop."""
    stub = health_pb2_grpc.HealthStub(channel)
    call = stub.Watch(health_pb2.HealthCheckRequest(service=service))
    try:
        try:
            async with asyncio.timeout(open_timeout_s):
                first = await call.read()
        except TimeoutError:
            loss.report(f"liveness watch did not open within {open_timeout_s:g} s")
            return None
        response = first
        while True:
            if response is grpc.aio.EOF:
                loss.report("liveness watch ended (the engine is shutting down)")
                return None
            status = response.status
            if status != _SERVING:
                name = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
                loss.report(f"liveness status {name}")
                return None
            response = await call.read()
    except grpc.aio.AioRpcError as exc:
        code = exc.code()
        details = exc.details() or ""
        if code in _NO_HEALTH_SERVICE:
            log.warning(
                "engine health service answered %s for %r: engine loss is not watched",
                code.name,
                service,
            )
            return None
        if code == grpc.StatusCode.UNAVAILABLE and KEEPALIVE_LOST in details:
            return f"liveness watch: {details}"
        loss.report(f"liveness watch failed: {code.name}: {details}".rstrip(": "))
        return None
    finally:
        call.cancel()


class LoadMonitor:
    """Feeds the load-based loss reasons: stale samples while busy, a changed instance id."""

    def __init__(self, loss: EngineLoss, instance_id: str, stale_s: float, now: float) -> None:
        self.loss = loss
        self.instance_id = instance_id
        self.stale_s = stale_s
        self.last_fresh = now
        self._last_stamp: int | None = None

    def sample(self, instance_id: str, stamp_ns: int | None, now: float) -> None:
        """A GetLoad answer. A sample is fresh unless its engine timestamp did not move."""
        if instance_id and self.instance_id and instance_id != self.instance_id:
            self.loss.report(f"engine instance id changed: {self.instance_id} -> {instance_id}")
            return
        if stamp_ns is None or stamp_ns != self._last_stamp:
            self.last_fresh = now
        self._last_stamp = stamp_ns

    def check(self, active_requests: int, now: float) -> None:
        """Call once per poll, after the sample (or the failed attempt). Only time with
        requests active counts: an idle engine whose load does not move is not stale."""
        if active_requests == 0:
            self.last_fresh = now
        elif now - self.last_fresh > self.stale_s:
            self.loss.report(
                f"no fresh load sample for {now - self.last_fresh:.0f} s "
                f"while {active_requests} requests are active"
            )
