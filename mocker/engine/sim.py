"""Drive a Scheduler on a simulated clock (tests, benches, offline what-ifs).

This is the reference for how a caller should loop: step at `now`, the pass's signals become
visible at `now + duration_ms` (its leading `early` ones at their own times, inside the pass);
when nothing is runnable, jump to `next_ready_ms()`.
"""

from __future__ import annotations

from .scheduler import PassResult, Scheduler, Signal


def timed_signals(res: PassResult, start_ms: float) -> list[tuple[float, Signal]]:
    """A pass's signals with the time each becomes visible: its leading `early` ones at their
    own release times, the rest at the pass's end (`start_ms` + its duration)."""
    out: list[tuple[float, Signal]] = []
    i = 0
    for at, n in res.early:
        out.extend((at, s) for s in res.signals[i:i + n])
        i += n
    end = start_ms + res.duration_ms
    out.extend((end, s) for s in res.signals[i:])
    return out


def run_until_idle(
    sched: Scheduler, start_ms: float = 0.0, *, max_passes: int = 1_000_000
) -> tuple[float, list[tuple[float, Signal]]]:
    """Step until no work is left; returns (end time, [(visible_at_ms, signal), ...]).

    Raises RuntimeError if `max_passes` passes did not drain the scheduler.
    """
    now = start_ms
    out: list[tuple[float, Signal]] = []
    for _ in range(max_passes):
        if not sched.has_work(now):
            nxt = sched.next_ready_ms(now)
            if nxt is None:
                return now, out
            now = nxt
            continue
        res = sched.step(now)
        out.extend(timed_signals(res, now))
        now += res.duration_ms
    raise RuntimeError(f"scheduler not idle after {max_passes} passes")
