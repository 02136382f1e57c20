"""Shared server state: config, engine loop, in-flight registries, fault switches."""

from __future__ import annotations

import asyncio
import itertools
import logging

from mocker.engine import Scheduler

from .config import RECORDER_CAPACITY, ServerConfig
from .engine_loop import EngineLoop
from .health import HealthServicer
from .inflight import LiveRequest
from .recorder import RequestRecorder
from .vocab import allowed_ids

log = logging.getLogger("mocker.server")


class ServerState:
    def __init__(self, cfg: ServerConfig, scheduler: Scheduler, health: HealthServicer) -> None:
        self.cfg = cfg
        #: The ids the engine emits (the token deriver's table).
        self.allowed_ids = allowed_ids(cfg.tokenizer, cfg.vocab_size)
        self.by_id: dict[str, LiveRequest] = {}
        self.by_key: dict[str, LiveRequest] = {}
        self.loop = EngineLoop(scheduler, self.by_key, cfg.run_ahead)
        self.health = health
        self.recorder = RequestRecorder(cfg.record_requests, RECORDER_CAPACITY)
        self.active = 0  # Generate calls holding a concurrency permit
        self.executor_failure: str | None = None
        self._seq = itertools.count()
        self.tokens_flowing = asyncio.Event()  # cleared while StallTokens is in effect
        self.tokens_flowing.set()
        self._unstall: asyncio.TimerHandle | None = None
        # Streaming counters (logged at stop): how much the streams coalesced.
        self.token_messages = 0  # TokenOutput events written
        self.tokens_streamed = 0  # tokens in them

    def register(self, request_id: str, has_session: bool) -> LiveRequest:
        key = f"{request_id}#{next(self._seq)}"
        live = LiveRequest(request_id, key, has_session)
        self.by_id[request_id] = live
        self.by_key[key] = live
        return live

    def release(self, live: LiveRequest) -> None:
        """The stream is over: forget it and make sure the engine stops working on it."""
        live.claimed = True
        self.loop.ack(live)
        if self.by_id.get(live.request_id) is live:
            del self.by_id[live.request_id]
        self.by_key.pop(live.key, None)
        if live.submitted and not live.done:
            self.loop.cancel(live.key)

    def abort(self, live: LiveRequest) -> bool:
        """Control.Abort: take the claim (False if the stream already ended or was claimed)."""
        if not live.claim():
            return False
        live.aborted = True
        if live.submitted and not live.done:
            self.loop.cancel(live.key)
        live.wake()
        return True

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
            if live.claim():
                live.failure = self.executor_failure
                if live.submitted and not live.done:
                    self.loop.cancel(live.key)
                live.wake()
                failed += 1
        return failed

    def check_stalls(self, now: float) -> None:
        """Consumer-stall watchdog: a write pending longer than the timeout ends the request."""
        limit = self.cfg.stall_timeout_s
        for live in list(self.by_key.values()):
            started = live.write_started
            if started and now - started > limit and live.claim():
                live.stalled = True
                log.warning(
                    "request %s: client stalled for %.0f s; aborting it (OVERLOADED)",
                    live.request_id,
                    now - started,
                )
                if live.submitted and not live.done:
                    self.loop.cancel(live.key)
