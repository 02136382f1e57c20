"""Sending one request through the fleet: aggregated, or prefill -> decode; retries.

`Dispatcher.run` reads in one direction: per attempt, the worker set is asked for the leg's
sidecar (`WorkerSet.pick`: a prefill sidecar only while decode sidecars are registered too), the
leg's stream is opened on it and read to its END (`_consume`), and its chunks go to the
request's writer (`lab/serve/frontend/writer.py`) through `_Request`, which also keeps what a
migration needs.

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
from typing import Any

from lab.serve.frontend.errors import ApiError, from_end_error
from lab.serve.frontend.protocol import GenRequest
from lab.serve.frontend.trace import Trace
from lab.serve.frontend.workers import (
    AGGREGATED,
    DECODE,
    PREFILL,
    SidecarHandle,
    WorkerSet,
    unavailable_errors,
)
from lab.serve.frontend.writer import ChunkWriter
from lab.serve.request_plane.api import PlaneStream
from lab.serve.request_plane.frames import FrameType
from lab.serve.router import Router

CHUNK = int(FrameType.CHUNK)
END = int(FrameType.END)


class _Retry(Exception):
    """A leg failed in a way another worker may fix."""

    def __init__(self, worker_id: str, error: ApiError, free: bool) -> None:
        super().__init__(error.message)
        self.worker_id = worker_id
        self.error = error
        self.free = free  # nothing ran: does not count against the migration limit


class _Request:
    """One request on its way through the fleet: what its attempts and legs share, and the one
    wrapper of its writer (every chunk that reaches the writer marks the leg as having emitted,
    and with migration on, its ids are kept for the continuation)."""

    __slots__ = ("emitted", "exclude", "gen", "generated", "model", "payload", "trace", "writer")

    def __init__(self, gen: GenRequest, trace: Trace, writer: ChunkWriter, model: str | None,
                 migrates: bool) -> None:
        self.gen = gen
        self.trace = trace
        self.writer = writer
        self.model = model  # the model a worker must serve (None: any, the served model)
        self.exclude: set[str] = set()  # workers this request failed on
        self.payload = gen.plane_payload(trace.request_id)  # this attempt's REQUEST
        self.generated: list[int] | None = [] if migrates else None
        self.emitted = False  # the current leg handed a chunk on

    def write_now(self, chunk: dict[str, Any]) -> bool:
        if not self.writer.write_now(chunk):
            return False
        self.emitted = True
        if self.generated is not None:
            self.generated.extend(chunk["t"])
        return True

    async def write(self, chunk: dict[str, Any]) -> None:
        self.emitted = True
        if self.generated is not None:
            self.generated.extend(chunk["t"])
        await self.writer.write(chunk)


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

    async def run(self, gen: GenRequest, trace: Trace, writer: ChunkWriter) -> None:
        """Serve `gen`, handing each CHUNK payload to `writer` (in order, one call each:
        `write_now` first, `write` when it declines); ApiError on failure.

        On return, trace.finish / stop_reason / usage hold the END's values.
        """
        model = None if gen.model == self.served_model else gen.model
        req = _Request(gen, trace, writer, model, migrates=self.migration_limit > 0)
        last: _Retry | None = None
        while True:
            try:
                await self._attempt(req)
                return
            except ApiError as exc:
                if last is not None and exc.code == "no_worker":
                    raise last.error from None  # nowhere to retry: report the original failure
                raise
            except _Retry as retry:
                last = retry
                req.exclude.add(retry.worker_id)
                if trace.moved_from is None:
                    trace.moved_from = []
                trace.moved_from.append(retry.worker_id)
                if not retry.free:
                    if trace.migrations >= self.migration_limit:
                        raise retry.error from None
                    trace.migrations += 1
                if req.generated:
                    payload = gen.continuation_payload(
                        f"{trace.request_id}-m{trace.migrations}", req.generated
                    )
                    if payload is None:  # the budget was used up before the failure
                        trace.finish = "length"
                        return
                    req.payload = payload

    async def _attempt(self, req: _Request) -> None:
        """Disaggregated while a prefill worker is left to try (one that just failed this
        request is excluded: the retry then goes aggregated, as when none is registered)."""
        prefill = self.workers.pick(PREFILL, self.router, req.model, req.exclude)
        if prefill is not None:
            end = await self._prefill_leg(prefill, req)
            if end is None:
                return
            usage = end.get("usage") or {}
            payload = {**req.payload, "handoff": end["handoff"],
                       "prefill_cached_tokens": usage.get("cached_tokens")}
            await self._leg(DECODE, req, payload)
            return
        if self.enforce_disagg:
            raise ApiError(
                503,
                "no prefill worker available and --enforce-disagg is set",
                code="no_prefill_worker",
            )
        await self._leg(AGGREGATED, req, req.payload)

    async def _prefill_leg(self, first: SidecarHandle, req: _Request) -> dict[str, Any] | None:
        """The prefill leg: its END (with a handoff), or None when it finished the request."""
        sidecar, stream = await self._open(PREFILL, first, req, req.payload)
        trace = req.trace
        trace.prefill_worker_id = sidecar.worker_id
        trace.prefill_start_ns = time.perf_counter_ns()
        held: list[dict[str, Any]] = []
        end = await self._consume(sidecar, stream, req, held)
        trace.prefill_end_ns = time.perf_counter_ns()
        if end.get("handoff"):
            return end
        for chunk in held:
            await req.write(chunk)
        trace.record_end(end)
        return None

    async def _leg(self, leg: str, req: _Request, payload: dict[str, Any]) -> None:
        """An aggregated or decode leg: its chunks go to the client as they come."""
        first = self.workers.pick(leg, self.router, req.model, req.exclude)
        sidecar, stream = await self._open(leg, first, req, payload)
        trace = req.trace
        trace.decode_worker_id = sidecar.worker_id
        trace.dispatch_ns = time.perf_counter_ns()
        trace.record_end(await self._consume(sidecar, stream, req, None))

    async def _open(
        self, leg: str, sidecar: SidecarHandle | None, req: _Request, payload: dict[str, Any]
    ) -> tuple[SidecarHandle, PlaneStream]:
        """Open the leg's stream on `sidecar`; one that cannot be reached is marked down and
        the worker set is asked for another."""
        tried: set[str] = set()
        while sidecar is not None:
            payload["model"] = sidecar.record.model
            try:
                return sidecar, await sidecar.client.open_stream(payload)
            except self._unavailable:
                sidecar.mark_down()
                tried.add(sidecar.worker_id)
            sidecar = self.workers.pick(leg, self.router, req.model, req.exclude | tried)
        detail = f" (could not connect to {', '.join(sorted(tried))})" if tried else ""
        raise ApiError(
            503,
            f"no {self.workers.roles_of(leg)} worker available for model "
            f"{req.gen.model!r}{detail}",
            code="no_worker",
        )

    async def _consume(
        self,
        sidecar: SidecarHandle,
        stream: PlaneStream,
        req: _Request,
        held: list[dict[str, Any]] | None,
    ) -> dict[str, Any]:
        """Read a stream to its END; CHUNKs go to the request's writer (or are held).
        Returns the END."""
        sidecar.inflight += 1
        ended = False
        req.emitted = False
        if held is None:
            stream.direct = req.write_now
        try:
            it = stream.__aiter__()
            while True:
                try:
                    ftype, p = await it.__anext__()
                except StopAsyncIteration:
                    break
                except self._unavailable as exc:
                    raise _Retry(
                        sidecar.worker_id,
                        ApiError(502, f"worker {sidecar.worker_id} failed mid-stream: {exc}"),
                        free=False,
                    ) from None
                if ftype == CHUNK:
                    if held is not None:
                        held.append(p)
                    else:
                        # one SSE event per CHUNK: never merged
                        await req.write(p)
                elif ftype == END:
                    ended = True
                    break
        finally:
            stream.direct = None
            sidecar.inflight -= 1
            if not ended:
                try:
                    await stream.cancel()
                except Exception:
                    pass
        if not ended:
            raise _Retry(
                sidecar.worker_id,
                ApiError(502, f"worker {sidecar.worker_id} closed the stream without an end"),
                free=False,
            )
        error = p.get("error")
        if error:
            api = from_end_error(error, sidecar.worker_id)
            kind = error.get("kind")
            if kind == "unavailable" and not req.emitted:
                raise _Retry(sidecar.worker_id, api, free=True)
            if kind in ("retryable", "unavailable"):
                raise _Retry(sidecar.worker_id, api, free=False)
            raise api
        return p
