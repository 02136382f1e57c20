"""Progress-based liveness: an engine that answers health but makes no progress leaves rotation.

A hung engine (a stuck executor, a GPU hang, a SIGSTOPped process) keeps its gRPC health SERVING
or simply stops answering; neither ends the liveness watch. Two signals catch it:

* `MessageCounter`: the request path bumps `messages` once per Generate message received (one
  attribute update, the only cost on the token path). `StallCheck` compares it across polls:
  requests in flight and no message on any of them for `stall_s` is a stall. Time only counts
  while requests are in flight, so an idle engine never stalls, and a request that arrives at an
  idle engine starts the clock when it arrives (within one poll).
* `StallCheck.load_asked` / `load_sample`: with nothing in flight, a GetLoad (the heartbeat) is
  outstanding and the engine has shown no sign of life for `stall_s` (a stopped process never
  answers), or GetLoad answers but its engine timestamp stood still and is older than `stall_s`
  (a frozen engine loop). An engine whose timestamps were never fresh nor moving (it does not
  stamp samples) is not judged by them. A sign of life is a GetLoad answer or token progress:
  the clock starts when a GetLoad is asked and not answered, never earlier than the last token.
  So a deep queue, whose GetLoads may answer late while tokens flow, is not judged by the
  moment the last sample arrived when it drains: the former rule (time since the last GetLoad
  answer) withdrew a busy engine the instant its queue emptied after a busy stretch with late
  or rare samples, and ended the next requests with 503.

A stalled worker withdraws from discovery and ends its in-flight requests with a retryable error
(the frontend migrates them). It stays up and probes the engine (`probe_engine`): one canary
generation (aggregated and decode roles), or a GetLoad sample whose timestamp advanced (prefill
role, whose canary would hold a KV session). When a probe succeeds the worker registers again.
The same probe gates the first registration, so a frozen engine never enters rotation.
"""

from __future__ import annotations

import asyncio
import logging
import time

import grpc

from lab.serve.sidecar.convert import EngineFacts, build_generate_request
from lab.shared.settings import CANARY_PROMPT

log = logging.getLogger("lab.sidecar")


class MessageCounter:
    """Counts Generate messages received across all streams (bumped on the request path)."""

    __slots__ = ("messages",)

    def __init__(self) -> None:
        self.messages = 0


class StallCheck:
    """Decides, once per poll, whether the engine stalled. Pure: the caller passes the clock."""

    def __init__(self, stall_s: float, now: float) -> None:
        self.stall_s = stall_s
        self._seen = -1
        self._last_progress = now
        self._last_life = now  # the last token progress or GetLoad answer
        self._asked: float | None = None  # when the oldest unanswered GetLoad was asked
        self._stamp: int | None = None
        self._stamp_live = False  # the engine's timestamps have been seen fresh or moving

    def reset(self, now: float) -> None:
        """Start afresh (after the worker re-entered rotation)."""
        self._seen = -1
        self._last_progress = now
        self._last_life = now
        self._asked = None

    def load_asked(self, now: float) -> None:
        """A GetLoad is about to be sent: until an answer shows progress, its clock runs."""
        if self._asked is None:
            self._asked = now

    def load_sample(self, stamp_ns: int | None, now: float, wall_ns: int | None = None) -> None:
        """A GetLoad answer (`wall_ns`: this host's time.time_ns() when it arrived). It shows
        progress unless its timestamp stood still and is stale."""
        if stamp_ns is not None:
            wall_ns = time.time_ns() if wall_ns is None else wall_ns
            fresh = abs(wall_ns - stamp_ns) <= self.stall_s * 1e9
            moved = self._stamp is not None and stamp_ns != self._stamp
            self._stamp = stamp_ns
            if fresh or moved:
                self._stamp_live = True
            elif self._stamp_live:
                if self._asked is None:  # frozen since its last live answer
                    self._asked = self._last_life
                return
        self._asked = None
        self._last_life = now

    def check(self, messages: int, active: int, now: float) -> str | None:
        """The stall reason, or None while the engine is making progress."""
        if active == 0 or messages != self._seen:
            if messages != self._seen:
                self._last_life = now
            self._seen = messages
            self._last_progress = now
        elif now - self._last_progress > self.stall_s:
            return (
                f"no token progress for {now - self._last_progress:.1f} s "
                f"while {active} requests are in flight"
            )
        if active == 0 and self._asked is not None:
            # With requests in flight token progress decides (a busy engine may answer GetLoad
            # late); idle, an engine that stopped answering is caught here.
            silent = now - max(self._asked, self._last_life)
            if silent > self.stall_s:
                return f"GetLoad has shown no progress for {silent:.1f} s"
        return None


async def _canary(link, facts: EngineFacts, request_id: str) -> None:
    greq, _plan = build_generate_request(
        {"request_id": request_id, "token_ids": list(CANARY_PROMPT), "max_tokens": 1}, facts
    )
    call = link.inference.Generate(greq)
    try:
        async for msg in call:
            kind = msg.WhichOneof("event")
            if kind == "token":
                continue
            if kind == "error":
                raise RuntimeError(f"canary ended with an engine error: {msg.error.message}")
            return
        raise RuntimeError("canary ended before a terminal response")
    finally:
        call.cancel()


async def _load_progress(link, timeout_s: float) -> None:
    """Two GetLoad samples whose engine timestamp advanced (or an engine that sends none)."""
    first = await link.load(timeout_s)
    if not first.HasField("timestamp_unix_nanos"):
        return
    while True:
        await asyncio.sleep(min(0.1, timeout_s / 4))
        later = await link.load(timeout_s)
        if later.timestamp_unix_nanos != first.timestamp_unix_nanos:
            return


async def probe_engine(link, facts: EngineFacts, timeout_s: float, attempt: int) -> str | None:
    """One readiness probe within `timeout_s`: None when the engine showed it can serve, else
    why not."""
    start = time.monotonic()
    try:
        async with asyncio.timeout(timeout_s):
            if facts.role == "prefill":
                await _load_progress(link, timeout_s)
            else:
                await _canary(link, facts, f"canary-{facts.instance_id or 'engine'}-{attempt}")
    except TimeoutError:
        what = "GetLoad did not advance" if facts.role == "prefill" else "no canary token"
        return f"{what} within {timeout_s:g} s"
    except grpc.aio.AioRpcError as exc:
        await asyncio.sleep(max(0.0, min(0.5, timeout_s - (time.monotonic() - start))))
        return f"probe failed: {exc.code().name}: {exc.details() or ''}".rstrip(": ")
    except RuntimeError as exc:
        await asyncio.sleep(max(0.0, min(0.5, timeout_s - (time.monotonic() - start))))
        return str(exc)
    return None
