"""The engine loop: one asyncio task owns the Scheduler and paces its passes.

Delivery rule: every pass hands each stream that advanced its token for that pass (one token
per stream per pass), and the Generate stream turns each pass's token into its own TokenOutput
(or, with `stream_interval` N > 1, every N tokens plus the last). Nothing merges the tokens of
different passes into one message: the writes downstream may carry several messages, each
message is still one pass's token.

Pacing follows two clocks, and a pass waits for both:

* Simulated time. Deadlines are absolute: while busy, a pass starts at the previous pass's
  simulated end (`t += duration`), so Python overhead inside a pass does not stretch simulated
  time; after an idle spell (or a freeze, or falling behind by more than RESYNC_MS) the clock
  restarts at now. A pass whose simulated end is in the future (speedup 1) is delivered only
  after sleeping to that end: never early.
* The consumers. Before the next step, the loop waits until every stream that got tokens from
  the last step has taken them (`ack`: its Generate generator picked them up to write them, or
  saw them and went back to waiting). A step is one pass, or, when the loop is behind its
  schedule (speedup 1000 or 0, where a pass costs more wall time than it simulates), a run of
  up to `run_ahead` (K) plain decode passes whose simulated ends have all passed already: each
  stream is handed their K tokens at once, drains them in one go, and the gRPC, request-plane
  and client socket writes downstream each carry K events of that stream instead of one
  (docs/token-path.md). A stream therefore holds at most K untaken tokens: memory stays
  bounded. On schedule (speedup 1) no pass has ended before it is run, so every step is one
  pass, as with K = 1.
  A stream that has not taken its tokens within PACE_WAIT_MS (its HTTP/2 window is full: the
  reader stopped) is marked slow and no longer waited for; its tokens queue up (at most its
  max_tokens) and it rejoins once it has caught up. The consumer-stall watchdog ends it with
  OVERLOADED if it never drains. So a stalled reader slows only its own stream.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from mocker.engine import Burst, EngineRequest, PassResult, Scheduler, Signal

from .inflight import Exit, LiveRequest

log = logging.getLogger("mocker.server")

#: Behind schedule by more than this (a freeze, a long GC pause, an engine paced by its
#: consumers at high speedup): restart the simulated clock at now.
RESYNC_MS = 250.0
#: How long the next pass waits for a stream to take its last token before that stream is
#: treated as slow (not waited for). Far above a healthy turn-around (a few ms with 256
#: streams on a busy 2-core machine), far below the 30 s stall watchdog.
PACE_WAIT_MS = 100.0
_INF = float("inf")


@dataclass
class LoopStats:
    passes: int = 0
    simulated_ms: float = 0.0  # sum of pass durations actually paced
    busy_wall_s: float = 0.0  # wall time spent in busy stretches (for drift)
    late_ms_max: float = 0.0
    fast_passes: int = 0  # passes run by Scheduler.fast_forward (plain decode steps)
    sleeps: int = 0  # passes delivered after sleeping to their end (on schedule)
    paced_waits: int = 0  # times the next pass waited for the consumers
    slow_marks: int = 0  # streams marked slow (did not take a token within PACE_WAIT_MS)


def _now_ms() -> float:
    return time.perf_counter() * 1000.0


class EngineLoop:
    def __init__(self, scheduler: Scheduler, live_by_key: dict[str, LiveRequest],
                 run_ahead: int = 1) -> None:
        self.scheduler = scheduler
        #: Most passes run and handed out together when they are already due (K >= 1).
        self.run_ahead = run_ahead
        self._live = live_by_key
        self._inbox: list[tuple[LiveRequest, EngineRequest]] = []
        self._wake = asyncio.Event()
        self._unfrozen = asyncio.Event()
        self._unfrozen.set()
        self._stopping = False
        self.frozen_at_ns: int | None = None
        self.stats = LoopStats()
        # Streams holding a token they have not taken yet (each has `unacked` set), and the
        # future the loop waits on until that count is back to zero.
        self._unacked = 0
        self._acked: asyncio.Future[None] | None = None

    # ----- called by the servicers (same thread, between passes) -----------------------------
    def now_ms(self) -> float:
        return _now_ms()

    def submit(self, live: LiveRequest, request: EngineRequest) -> None:
        """Queue for submission at the next pass start (an abort before then stops it)."""
        self._inbox.append((live, request))
        self._wake.set()

    def cancel(self, key: str) -> bool:
        return self.scheduler.cancel(key)

    def ack(self, live: LiveRequest) -> None:
        """The stream took what it was handed (or is gone): the next pass need not wait for it."""
        if live.took():
            self._unacked -= 1
            if self._unacked <= 0:
                self._unacked = 0
                fut = self._acked
                if fut is not None and not fut.done():
                    fut.set_result(None)

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
        fut = self._acked
        if fut is not None and not fut.done():
            fut.set_result(None)

    # ----- delivery ---------------------------------------------------------------------------
    def _drain_inbox(self) -> None:
        inbox, self._inbox = self._inbox, []
        add = self.scheduler.add
        for live, request in inbox:
            if live.exit is not None or self._live.get(live.key) is not live:
                continue  # aborted (or gone) before submission: never reaches the scheduler
            add(request)
            live.submitted = True

    def _deliver(self, signals: list[Signal]) -> None:
        live_map = self._live
        unacked = 0
        for s in signals:
            live = live_map.get(s.key)
            if live is None:
                continue
            if s.rejected:
                live.end(Exit.REJECTED)
            elif s.token_id is None:
                live.end(Exit.MISSING_TOKEN)
            else:
                if s.cached_tokens is not None:
                    live.cached = s.cached_tokens
                unacked += live.hand([s.token_id])
                if s.completed:
                    live.end(Exit.COMPLETED)
        self._unacked += unacked

    def _deliver_burst(self, burst: Burst) -> None:
        """Fast-forwarded passes: every running request got exactly one token per pass."""
        live_map = self._live
        unacked = 0
        for key, toks in zip(burst.keys, burst.tokens, strict=True):
            live = live_map.get(key)
            if live is not None:
                unacked += live.hand(toks)
        self._unacked += unacked

    async def _wait_for_consumers(self) -> None:
        """Until every stream handed a token has taken it, or PACE_WAIT_MS has passed (then the
        laggards are marked slow and no longer waited for)."""
        self.stats.paced_waits += 1
        loop = asyncio.get_running_loop()
        fut = self._acked = loop.create_future()
        timer = loop.call_later(PACE_WAIT_MS / 1000.0, _resolve, fut)
        try:
            await fut
        finally:
            timer.cancel()
            self._acked = None
        if self._unacked and not self._stopping:
            for live in self._live.values():
                if live.unacked:
                    self.stats.slow_marks += 1
                    if live.mark_slow():
                        log.info(
                            "request %s: its reader took no token for %.0f ms; the engine "
                            "no longer waits for it (its tokens queue)",
                            live.request_id,
                            PACE_WAIT_MS,
                        )
            self._unacked = 0

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

    # ----- the task ---------------------------------------------------------------------------
    async def run(self) -> None:
        sched = self.scheduler
        stats = self.stats
        sleep = asyncio.sleep
        fast_forward = sched.fast_forward
        run_ahead = self.run_ahead
        t_ms: float | None = None  # simulated start of the next pass (perf_counter ms axis)
        busy_since = 0.0
        # Passes handed out since the consumers last had a turn: up to `run_ahead` of them, all
        # already due, run back to back before the loop waits for every stream to take its
        # tokens (with run_ahead 1: after every pass, lock-step).
        ahead = 0
        while not self._stopping:
            if ahead >= run_ahead:
                ahead = 0
                if self._unacked:
                    await self._wait_for_consumers()
                else:
                    await sleep(0)  # every stream took its tokens already: let I/O run
                continue
            if not self._unfrozen.is_set():
                if t_ms is not None:
                    stats.busy_wall_s += (_now_ms() - busy_since) / 1000.0
                t_ms = None
                ahead = run_ahead  # the consumers first
                await self._unfrozen.wait()
                continue
            if self._inbox:
                self._drain_inbox()
            if not sched.has_work():
                if self._unacked:
                    ahead = run_ahead  # what was handed out goes first
                    continue
                if t_ms is not None:
                    stats.busy_wall_s += (_now_ms() - busy_since) / 1000.0
                t_ms = None
                await self._idle(None)
                continue
            now = _now_ms()
            if t_ms is None:
                t_ms = busy_since = self._resume_ms(now)
            elif now - t_ms > RESYNC_MS:
                stats.busy_wall_s += (now - busy_since) / 1000.0
                t_ms = busy_since = now
            # Plain decode passes (every running request gets one token each) without the
            # per-pass objects of `step`: behind schedule, as many of the window's passes as
            # have ended by now; otherwise the next one, slept to its end. Anything else
            # (admission, prefill, a finishing request) by step.
            room = run_ahead - ahead
            burst = fast_forward(t_ms, now, room * sched.running_count) if room > 1 \
                else fast_forward(t_ms, _INF, 1)
            if not burst.passes and room > 1:
                burst = fast_forward(t_ms, _INF, 1)
            result: PassResult | None = None
            if burst.passes:
                end = burst.end_ms
            else:
                result = sched.step(t_ms)
                if _empty(result):
                    if self._unacked:
                        ahead = run_ahead  # hand out what is due before sleeping
                        continue
                    # Nothing schedulable yet (e.g. waiting for a KV transfer): sleep until ready.
                    stats.busy_wall_s += (_now_ms() - busy_since) / 1000.0
                    t_ms = None
                    await self._idle_until_ready(now)
                    continue
                end = t_ms + result.duration_ms
            at_end = result.signals if result is not None else []
            if result is not None and result.early:
                # held first tokens whose floor falls inside this pass: out at the floor
                at_end = await self._release_early(result)
            now = _now_ms()
            if end > now:  # on schedule: never deliver before the pass's simulated end
                stats.sleeps += 1
                await sleep((end - now) / 1000.0)
                ahead = 0  # the consumers had their turn while the loop slept
            elif now - end > stats.late_ms_max:
                stats.late_ms_max = now - end
            t_ms = end
            if result is None:
                stats.passes += burst.passes
                stats.fast_passes += burst.passes
                stats.simulated_ms += burst.simulated_ms
                self._deliver_burst(burst)
                ahead += burst.passes
            else:
                stats.passes += 1
                stats.simulated_ms += result.duration_ms
                if at_end:
                    self._deliver(at_end)
                ahead += 1
            if not self._unacked and end <= now:
                ahead = 0
                await sleep(0)  # nothing handed out (e.g. a prefill chunk): let I/O run
        for live in list(self._live.values()):
            live.end(Exit.CLOSED)  # (a no-op for a stream that was ended or claimed already)

    def _resume_ms(self, now: float) -> float:
        """The simulated start of the first pass after an idle spell: when its first request
        became ready, not when the loop woke up for it. The wake-up is late by the event
        loop's timer granularity (libuv's is a millisecond) and its scheduling, and a pass
        started then would also take in the requests that became ready in between: a burst
        of arrivals a few hundred microseconds apart would share one pass, where an engine
        that starts as soon as the first is ready runs it alone (vLLM, docs/fidelity.md)."""
        first = self.scheduler.first_ready_ms(now)
        if first is None or now - first > RESYNC_MS:
            return now
        return first

    async def _release_early(self, result: PassResult) -> list[Signal]:
        """Deliver the pass's `early` signals, each group once its time has come (sleeping
        to it), and return the signals left for the pass end."""
        signals, i = result.signals, 0
        for at, n in result.early:
            wait = at - _now_ms()
            if wait > 0:
                await asyncio.sleep(wait / 1000.0)
            self._deliver(signals[i:i + n])
            i += n
        return signals[i:]

    async def _idle_until_ready(self, now: float) -> None:
        ready = self.scheduler.next_ready_ms()
        await self._idle(None if ready is None else max(0.0, (ready - now) / 1000.0))


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def _empty(result: PassResult) -> bool:
    return not result.signals and result.batch_size == 0 and result.duration_ms <= 0.0
