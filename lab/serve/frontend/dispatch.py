"""Sending one request through the fleet: aggregated, or prefill -> decode; retries.

Aggregated (no prefill workers registered): one leg to an aggregated or decode worker.
Disaggregated (prefill and decode workers registered): the prefill leg goes to a prefill worker
with the original request (its sidecar sets max_tokens=1 / context_only itself); its END carries
the handoff, which never reaches the client; the decode leg goes to a decode worker with the
original max_tokens, the handoff and the prefill leg's cached-token count. If the prefill leg
ends the request by itself (no handoff, e.g. EOS on the first token), its tokens are the answer.

Failures:
* connecting to a worker fails, or the worker answers `unavailable` before any token: try
  another worker (free: nothing ran); none left -> 503.
* END.error of kind `retryable`, or the stream breaks: migrate to another worker at most
  `migration_limit` times (the retry carries the prompt plus the tokens already sent, and the
  remaining token budget); then the error reaches the client.
* any other END.error: mapped to its status (400 invalid request, 500 engine error, ...).
* the client goes away (the handler is cancelled or a write fails): the open stream is cancelled,
  which makes the sidecar abort the engine request.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from lab.serve.frontend.errors import ApiError, from_end_error
from lab.serve.frontend.protocol import GenRequest
from lab.serve.frontend.workers import Worker, WorkerSet, unavailable_errors
from lab.serve.request_plane.api import PlaneStream
from lab.serve.request_plane.frames import FrameType
from lab.serve.router import Router

CHUNK = int(FrameType.CHUNK)
END = int(FrameType.END)

AGGREGATED_ROLES = ("aggregated", "decode")
PREFILL_ROLES = ("prefill",)
DECODE_ROLES = ("decode",)

OnChunk = Callable[[dict[str, Any]], Awaitable[None]]
#: Optional synchronous fast path for a CHUNK: True if it took the chunk without waiting,
#: False to have it delivered to the OnChunk instead (e.g. while the client's socket is full).
OnChunkNow = Callable[[dict[str, Any]], bool]


@dataclass(slots=True)
class Trace:
    """What happened to one request (worker ids, timestamps in perf_counter_ns, outcome)."""

    request_id: str
    received_ns: int
    received_wall_ms: float
    prefill_worker_id: str | None = None
    decode_worker_id: str | None = None
    prefill_start_ns: int = 0
    prefill_end_ns: int = 0
    dispatch_ns: int = 0
    first_token_ns: int = 0
    last_token_ns: int = 0
    end_ns: int = 0
    tokens: int = 0
    finish: str | None = None
    stop_reason: Any = None
    usage: dict[str, Any] | None = None
    migrations: int = 0
    moved_from: list[str] | None = None  # workers a leg failed on before another took over
    status: int = 200  # HTTP status sent (200 also for a stream that ended with an error event)
    outcome: str = "success"

    def record_end(self, end: dict[str, Any]) -> None:
        """Keep the outcome the request's END reports."""
        self.finish = end.get("finish")
        self.stop_reason = end.get("stop_reason")
        self.usage = end.get("usage")

    def timing(self) -> dict[str, Any]:
        """nvext.timing (milliseconds; request_received_ms is wall-clock epoch ms)."""
        recv = self.received_ns
        first_leg = self.prefill_start_ns or self.dispatch_ns
        if self.prefill_start_ns:
            prefill_ms = (
                _ms(self.prefill_end_ns - self.prefill_start_ns) if self.prefill_end_ns else None
            )
        else:
            prefill_ms = (
                _ms(self.first_token_ns - self.dispatch_ns) if self.first_token_ns else None
            )
        return {
            "request_received_ms": round(self.received_wall_ms, 3),
            "prefill_wait_time_ms": _ms(first_leg - recv) if first_leg else None,
            "prefill_time_ms": prefill_ms,
            "ttft_ms": _ms(self.first_token_ns - recv) if self.first_token_ns else None,
            "total_time_ms": _ms((self.end_ns or time.perf_counter_ns()) - recv),
        }

    def worker_ids(self) -> dict[str, Any]:
        ids: dict[str, Any] = {
            "prefill_worker_id": self.prefill_worker_id,
            "decode_worker_id": self.decode_worker_id,
        }
        if self.moved_from:
            ids["moved_from"] = self.moved_from
        return ids


def _ms(ns: int) -> float:
    return round(ns / 1e6, 3)


class _Retry(Exception):
    """A leg failed in a way another worker may fix."""

    def __init__(self, worker_id: str, error: ApiError, free: bool) -> None:
        super().__init__(error.message)
        self.worker_id = worker_id
        self.error = error
        self.free = free  # nothing ran: does not count against the migration limit


@dataclass(frozen=True)
class _Leg:
    """What every leg of one attempt at a request shares: the model override, the trace, where
    its chunks go, and the workers it must not use."""

    model: str | None
    trace: Trace
    on_chunk: OnChunk
    on_chunk_now: OnChunkNow | None
    exclude: set[str]


class Dispatcher:
    def __init__(
        self,
        workers: WorkerSet,
        router: Router,
        *,
        served_model: str,
        enforce_disagg: bool = False,
        migration_limit: int = 0,
    ) -> None:
        self.workers = workers
        self.router = router
        self.served_model = served_model
        self.enforce_disagg = enforce_disagg
        self.migration_limit = migration_limit
        self._unavailable = unavailable_errors()

    async def run(
        self,
        req: GenRequest,
        trace: Trace,
        on_chunk: OnChunk,
        on_chunk_now: OnChunkNow | None = None,
    ) -> None:
        """Serve `req`, handing each CHUNK payload (in order, one call each) to `on_chunk_now`
        when given and it takes it, else to `on_chunk`; ApiError on failure.

        On return, trace.finish / stop_reason / usage hold the END's values.
        """
        payload = req.plane_payload(trace.request_id)
        model = None if req.model == self.served_model else req.model
        exclude: set[str] = set()
        generated: list[int] | None = None
        sink = on_chunk
        sink_now = on_chunk_now
        if self.migration_limit > 0:
            generated = []
            track = generated

            async def sink(p: dict[str, Any]) -> None:
                track.extend(p.get("t") or ())
                await on_chunk(p)

            if on_chunk_now is not None:
                now = on_chunk_now

                def sink_now(p: dict[str, Any]) -> bool:
                    if now(p):
                        track.extend(p.get("t") or ())
                        return True
                    return False

        last: _Retry | None = None
        while True:
            try:
                await self._once(payload, _Leg(model, trace, sink, sink_now, exclude))
                return
            except ApiError as exc:
                if last is not None and exc.code == "no_worker":
                    raise last.error from None  # nowhere to retry: report the original failure
                raise
            except _Retry as retry:
                last = retry
                exclude.add(retry.worker_id)
                if trace.moved_from is None:
                    trace.moved_from = []
                trace.moved_from.append(retry.worker_id)
                if not retry.free:
                    if trace.migrations >= self.migration_limit:
                        raise retry.error from None
                    trace.migrations += 1
                if generated:
                    continuation = self._continuation(req, trace, generated)
                    if continuation is None:  # the budget was used up before the failure
                        trace.finish = "length"
                        return
                    payload = continuation

    def _continuation(self, req: GenRequest, trace: Trace, generated: list[int]) -> dict | None:
        payload = req.plane_payload(f"{trace.request_id}-m{trace.migrations}")
        payload["token_ids"] = req.token_ids + generated
        if req.max_tokens is not None:
            remaining = req.max_tokens - len(generated)
            if remaining <= 0:
                return None
            payload["max_tokens"] = remaining
        if req.min_tokens is not None:
            payload["min_tokens"] = max(0, req.min_tokens - len(generated))
        return payload

    async def _once(self, payload: dict[str, Any], leg: _Leg) -> None:
        workers = self.workers
        # Disaggregated while a prefill worker is left to try (one that just failed this request
        # is excluded: the retry then goes aggregated, as when none is registered).
        if workers.has_role("decode") and workers.any_available(PREFILL_ROLES, leg.model,
                                                                 leg.exclude):
            end = await self._prefill(payload, leg)
            if end is None:
                return
            usage = end.get("usage") or {}
            decode_payload = dict(payload)
            decode_payload["handoff"] = end["handoff"]
            decode_payload["prefill_cached_tokens"] = usage.get("cached_tokens")
            await self._leg(DECODE_ROLES, decode_payload, leg)
            return
        if self.enforce_disagg:
            raise ApiError(
                503,
                "no prefill worker available and --enforce-disagg is set",
                code="no_prefill_worker",
            )
        await self._leg(AGGREGATED_ROLES, payload, leg)

    async def _open(
        self,
        roles: tuple[str, ...],
        payload: dict[str, Any],
        model: str | None,
        exclude: set[str],
    ) -> tuple[Worker, PlaneStream]:
        tried: set[str] = set()
        while True:
            worker = self.workers.pick(
                roles, self.router, model, exclude | tried if tried else exclude
            )
            if worker is None:
                what = "/".join(roles)
                detail = f" (could not connect to {', '.join(sorted(tried))})" if tried else ""
                raise ApiError(
                    503,
                    f"no {what} worker available for model {payload['model']!r}{detail}",
                    code="no_worker",
                )
            payload["model"] = worker.record.model
            try:
                stream = await worker.client.open_stream(payload)
            except self._unavailable:
                worker.mark_down()
                tried.add(worker.worker_id)
                continue
            return worker, stream

    async def _consume(
        self,
        worker: Worker,
        stream: PlaneStream,
        on_chunk: OnChunk | None,
        held: list[dict[str, Any]] | None,
        on_chunk_now: OnChunkNow | None = None,
    ) -> dict[str, Any]:
        """Read a stream to its END; CHUNKs go to on_chunk_now / on_chunk (or are held).
        Returns the END."""
        worker.inflight += 1
        ended = False
        emitted = False
        if on_chunk_now is not None and held is None:

            def direct(p: dict[str, Any]) -> bool:
                nonlocal emitted
                if on_chunk_now(p):
                    emitted = True
                    return True
                return False

            stream.direct = direct
        try:
            it = stream.__aiter__()
            while True:
                try:
                    ftype, p = await it.__anext__()
                except StopAsyncIteration:
                    break
                except self._unavailable as exc:
                    raise _Retry(
                        worker.worker_id,
                        ApiError(502, f"worker {worker.worker_id} failed mid-stream: {exc}"),
                        free=False,
                    ) from None
                if ftype == CHUNK:
                    if held is not None:
                        held.append(p)
                    else:
                        emitted = True
                        # one SSE event per CHUNK: never merged (held is None: on_chunk given)
                        await on_chunk(p)  # type: ignore[misc]
                elif ftype == END:
                    ended = True
                    break
        finally:
            stream.direct = None
            worker.inflight -= 1
            if not ended:
                try:
                    await stream.cancel()
                except Exception:
                    pass
        if not ended:
            raise _Retry(
                worker.worker_id,
                ApiError(502, f"worker {worker.worker_id} closed the stream without an end"),
                free=False,
            )
        error = p.get("error")
        if error:
            api = from_end_error(error, worker.worker_id)
            kind = error.get("kind")
            if kind == "unavailable" and not emitted:
                raise _Retry(worker.worker_id, api, free=True)
            if kind in ("retryable", "unavailable"):
                raise _Retry(worker.worker_id, api, free=False)
            raise api
        return p

    async def _leg(self, roles: tuple[str, ...], payload: dict[str, Any], leg: _Leg) -> None:
        """An aggregated or decode leg: its chunks go to the client as they come."""
        worker, stream = await self._open(roles, payload, leg.model, leg.exclude)
        trace = leg.trace
        trace.decode_worker_id = worker.worker_id
        trace.dispatch_ns = time.perf_counter_ns()
        end = await self._consume(worker, stream, leg.on_chunk, None, leg.on_chunk_now)
        trace.record_end(end)

    async def _prefill(self, payload: dict[str, Any], leg: _Leg) -> dict[str, Any] | None:
        """The prefill leg: its END (with a handoff), or None when it finished the request."""
        worker, stream = await self._open(PREFILL_ROLES, payload, leg.model, leg.exclude)
        trace = leg.trace
        trace.prefill_worker_id = worker.worker_id
        trace.prefill_start_ns = time.perf_counter_ns()
        held: list[dict[str, Any]] = []
        end = await self._consume(worker, stream, None, held)
        trace.prefill_end_ns = time.perf_counter_ns()
        if end.get("handoff"):
            return end
        for p in held:
            await leg.on_chunk(p)
        trace.record_end(end)
        return None
