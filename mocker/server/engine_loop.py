"""The engine loop: one asyncio task owns the Scheduler and paces its passes in real time.

Pacing keeps ABSOLUTE deadlines: while busy, a pass starts at the previous pass's simulated end
(`t += duration`), so Python overhead inside a pass does not stretch simulated time; after an
idle spell (or a freeze, or falling behind by more than RESYNC_MS) the clock restarts at now.

Delivery rule (what makes a stream send several tokens in one message):

* On schedule (the pass ends in the future, e.g. speedup 1): sleep to the pass end, then
  deliver its signals. Each stream wakes as soon as its token's pass ends, so a keeping-up
  client sees one token per TokenOutput and the measured ITL is true.
* Behind schedule (the pass already ended when the loop got back to it, e.g. speedup 1000
  where passes last microseconds, or speedup 0): deliver it and keep running the passes that
  are ALSO already over, back to back in the same event-loop turn, for up to BURST_MS of wall
  time, then yield once. Every stream wakes once per turn and sends all its ready tokens as
  one message. A pass whose end is still in the future is never delivered early. Plain
  decode passes are run by `Scheduler.fast_forward` (same results as `step`, without the
  per-pass objects); anything else (admission, prefill, a finishing request) by `step`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from mocker.engine import Burst, EngineRequest, PassResult, Scheduler, Signal

from .inflight import LiveRequest

#: Behind schedule by more than this (a freeze, a long GC pause): restart the clock at now
#: instead of bursting back-to-back passes to catch up.
RESYNC_MS = 250.0
#: Behind schedule, the overdue passes run back to back for up to this much wall time per
#: event-loop turn (see the delivery rule above). Long enough that a stream's message carries
#: many tokens at speedup 1000, short enough that gRPC I/O is not held up noticeably
#: (1, 2 and 4 ms measured the same engine CPU per request; 0 = one pass per turn costs ~2x).
BURST_MS = 2.0
#: Work per `Scheduler.fast_forward` call between two wall-clock checks (tokens).
FAST_FORWARD_TOKENS = 64


@dataclass
class LoopStats:
    passes: int = 0
    simulated_ms: float = 0.0  # sum of pass durations actually paced
    busy_wall_s: float = 0.0  # wall time spent in busy stretches (for drift)
    late_ms_max: float = 0.0
    fast_passes: int = 0  # passes run by Scheduler.fast_forward (catching up)
    sleeps: int = 0  # passes delivered after sleeping to their end (on schedule)


def _now_ms() -> float:
    return time.perf_counter() * 1000.0


class EngineLoop:
    def __init__(self, scheduler: Scheduler, live_by_key: dict[str, LiveRequest]) -> None:
        self.scheduler = scheduler
        self._live = live_by_key
        self._inbox: list[tuple[LiveRequest, EngineRequest]] = []
        self._wake = asyncio.Event()
        self._unfrozen = asyncio.Event()
        self._unfrozen.set()
        self._stopping = False
        self.frozen_at_ns: int | None = None
        self.stats = LoopStats()

    # ----- called by the servicers (same thread, between passes) -----------------------------
    def now_ms(self) -> float:
        return _now_ms()

    def submit(self, live: LiveRequest, request: EngineRequest) -> None:
        """Queue for submission at the next pass start (an abort before then stops it)."""
        self._inbox.append((live, request))
        self._wake.set()

    def cancel(self, key: str) -> bool:
        return self.scheduler.cancel(key)

    def freeze(self, frozen: bool) -> None:
        if frozen:
            if self._unfrozen.is_set():
                self.frozen_at_ns = time.time_ns()
            self._unfrozen.clear()
        else:
            self.frozen_at_ns = None
            self._unfrozen.set()
            self._wake.set()

    @property
    def frozen(self) -> bool:
        return not self._unfrozen.is_set()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        self._unfrozen.set()

    # ----- the task ---------------------------------------------------------------------------
    def _drain_inbox(self) -> None:
        inbox, self._inbox = self._inbox, []
        add = self.scheduler.add
        for live, request in inbox:
            if live.claimed or live.done or self._live.get(live.key) is not live:
                continue  # aborted (or gone) before submission: never reaches the scheduler
            add(request)
            live.submitted = True

    def _deliver(self, signals: list[Signal]) -> None:
        live_map = self._live
        for s in signals:
            live = live_map.get(s.key)
            if live is None:
                continue
            if s.rejected:
                live.rejected = True
                live.done = True
            elif s.token_id is None:
                live.missing = True
                live.done = True
            else:
                live.tokens.append(s.token_id)
                if s.cached_tokens is not None:
                    live.cached = s.cached_tokens
                if s.completed:
                    live.completed = True
                    live.done = True
            w = live.waiter
            if w is not None:
                live.waiter = None
                if not w.done():
                    w.set_result(None)

    def _deliver_burst(self, burst: Burst) -> None:
        live_map = self._live
        for key, toks in zip(burst.keys, burst.tokens, strict=True):
            live = live_map.get(key)
            if live is None:
                continue
            live.tokens.extend(toks)
            w = live.waiter
            if w is not None:
                live.waiter = None
                if not w.done():
                    w.set_result(None)

    async def _idle(self, timeout_s: float | None) -> None:
        self._wake.clear()
        if self._inbox or self._stopping:
            return
        if timeout_s is None:
            await self._wake.wait()
            return
        handle = asyncio.get_running_loop().call_later(timeout_s, self._wake.set)
        try:
            await self._wake.wait()
        finally:
            handle.cancel()

    async def run(self) -> None:
        sched = self.scheduler
        stats = self.stats
        sleep = asyncio.sleep
        burst_ms = BURST_MS
        fast_forward = sched.fast_forward
        t_ms: float | None = None  # simulated start of the next pass (perf_counter ms axis)
        busy_since = 0.0
        while not self._stopping:
            if not self._unfrozen.is_set():
                if t_ms is not None:
                    stats.busy_wall_s += (_now_ms() - busy_since) / 1000.0
                t_ms = None
                await self._unfrozen.wait()
                continue
            if self._inbox:
                self._drain_inbox()
            if not sched.has_work():
                if t_ms is not None:
                    stats.busy_wall_s += (_now_ms() - busy_since) / 1000.0
                t_ms = None
                await self._idle(None)
                continue
            now = _now_ms()
            if t_ms is None:
                t_ms = busy_since = now
            elif now - t_ms > RESYNC_MS:
                stats.busy_wall_s += (now - busy_since) / 1000.0
                t_ms = busy_since = now
            result = sched.step(t_ms)
            if _empty(result):
                # Nothing schedulable yet (e.g. waiting for a KV transfer): sleep until ready.
                stats.busy_wall_s += (_now_ms() - busy_since) / 1000.0
                t_ms = None
                await self._idle_until_ready(now)
                continue
            end = t_ms + result.duration_ms
            now = _now_ms()
            if end > now:  # on schedule: sleep to the pass end, then deliver
                stats.sleeps += 1
                await sleep((end - now) / 1000.0)
                t_ms = end
                self._account(result)
                continue
            if now - end > stats.late_ms_max:
                stats.late_ms_max = now - end
            t_ms = end
            self._account(result)
            # Behind schedule (the pass ended before we got here): keep running the passes
            # that are overdue too, in this same event-loop turn, for up to BURST_MS. Every
            # stream then wakes once per turn and sends all its ready tokens as one message.
            burst_end = now + burst_ms
            idle = False
            while not self._inbox and not self._stopping and sched.has_work():
                now = _now_ms()
                if now >= burst_end or t_ms >= now:
                    break
                ff = fast_forward(t_ms, now, FAST_FORWARD_TOKENS)
                if ff.passes:
                    t_ms = ff.end_ms
                    stats.passes += ff.passes
                    stats.fast_passes += ff.passes
                    stats.simulated_ms += ff.simulated_ms
                    self._deliver_burst(ff)
                    continue
                result = sched.step(t_ms)
                if _empty(result):
                    idle = True
                    break
                end = t_ms + result.duration_ms
                if end > now:  # this one is not due yet: let the streams run meanwhile
                    await sleep((end - now) / 1000.0)
                    t_ms = end
                    self._account(result)
                    break
                t_ms = end
                self._account(result)
            if idle:  # nothing schedulable yet (as above)
                stats.busy_wall_s += (_now_ms() - busy_since) / 1000.0
                t_ms = None
                await self._idle_until_ready(now)
                continue
            await sleep(0)
        for live in list(self._live.values()):
            if not live.done:
                live.done = True
                live.wake()

    def _account(self, result: PassResult) -> None:
        stats = self.stats
        stats.passes += 1
        stats.simulated_ms += result.duration_ms
        if result.signals:
            self._deliver(result.signals)

    async def _idle_until_ready(self, now: float) -> None:
        ready = self.scheduler.next_ready_ms()
        await self._idle(None if ready is None else max(0.0, (ready - now) / 1000.0))


def _empty(result: PassResult) -> bool:
    return not result.signals and result.batch_size == 0 and result.duration_ms <= 0.0
