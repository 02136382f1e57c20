"""Shared server state: config, engine loop, in-flight registries, fault switches."""

from __future__ import annotations

import asyncio
import itertools
import logging

from mocker.engine import Scheduler

from .config import RECORDER_CAPACITY, ServerConfig
from .engine_loop import EngineLoop
from .health import HealthServicer
from .inflight import Exit, LiveRequest
from .recorder import RequestRecorder

log = logging.getLogger("mocker.server")


class ServerState:
    def __init__(self, cfg: ServerConfig, scheduler: Scheduler, health: HealthServicer) -> None:
        self.cfg = cfg
        self.by_id: dict[str, LiveRequest] = {}
        self.by_key: dict[str, LiveRequest] = {}
        self.engine = EngineLoop(scheduler, self.by_key, cfg.settings.run_ahead)
        self.health = health
        self.recorder = RequestRecorder(cfg.settings.record_requests, RECORDER_CAPACITY)
        self.active = 0  # registered requests: each holds a concurrency permit
        self.executor_failure: str | None = None
        self._seq = itertools.count()
        self.tokens_flowing = asyncio.Event()  # cleared while StallTokens is in effect
        self.tokens_flowing.set()
        self._unstall: asyncio.TimerHandle | None = None
        # Streaming counters (logged at stop): how much the streams coalesced.
        self.token_messages = 0  # TokenOutput events written
        self.tokens_streamed = 0  # tokens in them

    def register(self, request_id: str, has_session: bool) -> LiveRequest:
        """An admitted request: it holds a concurrency permit and its id until `release`."""
        key = f"{request_id}#{next(self._seq)}"
        live = LiveRequest(request_id, key, has_session)
        self.active += 1
        self.by_id[request_id] = live
        self.by_key[key] = live
        return live

    def release(self, live: LiveRequest) -> None:
        """The stream is over: forget it and make sure the engine stops working on it."""
        # A no-op claim after the stream's own terminal; a stream that went away without one
        # (its client cancelled) ends CLOSED, so nothing else claims it.
        live.finish(Exit.CLOSED)
        self.active -= 1
        self.engine.ack(live)
        if self.by_id.get(live.request_id) is live:
            del self.by_id[live.request_id]
        self.by_key.pop(live.key, None)
        self._stop_engine(live)

    def abort(self, live: LiveRequest) -> bool:
        """Control.Abort: take the claim (False if the stream already ended or was claimed)."""
        if not live.claim(Exit.ABORTED):
            return False
        self._stop_engine(live)
        return True

    def _stop_engine(self, live: LiveRequest) -> None:
        """The engine stops working on a claimed request (a no-op if it never got it or has
        finished it)."""
        if live.submitted:
            self.engine.cancel(live.key)

    # ----- faults -------------------------------------------------------------------------------
    def stall_tokens(self, seconds: float) -> None:
        if self._unstall is not None:
            self._unstall.cancel()
            self._unstall = None
        if seconds <= 0:
            self.tokens_flowing.set()
            return
        self.tokens_flowing.clear()
        self._unstall = asyncio.get_running_loop().call_later(seconds, self.tokens_flowing.set)

    def fail_executor(self, message: str) -> int:
        """Every in-flight request ends with an in-band INTERNAL error; new ones are refused."""
        self.executor_failure = message or "simulated executor failure"
        failed = 0
        for live in list(self.by_key.values()):
            if live.claim(Exit.FAILED, self.executor_failure):
                self._stop_engine(live)
                failed += 1
        return failed

    def check_stalls(self, now: float) -> None:
        """Consumer-stall watchdog: a write pending longer than the timeout ends the request."""
        limit = self.cfg.settings.stall_timeout
        for live in list(self.by_key.values()):
            started = live.write_started
            if started and now - started > limit and live.claim(Exit.STALLED):
                log.warning(
                    "request %s: client stalled for %.0f s; aborting it (OVERLOADED)",
                    live.request_id,
                    now - started,
                )
                self._stop_engine(live)
