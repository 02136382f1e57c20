"""The engine loop's run-ahead window (no sockets): behind schedule, up to K passes that have
already ended are handed out together, so a consumer that drains what it finds (as the Generate
stream does) finds K tokens per wake-up, never more; on schedule every wake-up still finds one
token; a consumer that stops taking is left behind without holding up the others."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import pytest
import uvloop

from mocker.engine import EngineArgs
from mocker.engine.pass_cost import long_running_scheduler
from mocker.server.engine_loop import EngineLoop
from mocker.server.inflight import LiveRequest

RUNNING = 4
K = 4
#: What one wake-up of a stream costs (blocking, like a gRPC write): 4 streams make a loop
#: turn of ~2 ms, longer than a pass at speedup 1000 (~6 us), shorter than one at 1 (~6 ms).
WAKE_COST_S = 0.0005


@dataclass
class Seen:
    per_wake: dict[str, list[int]] = field(default_factory=dict)  # tokens found at each wake
    positions: dict[str, list[int]] = field(default_factory=dict)  # every token, in order
    backlog_max: dict[str, int] = field(default_factory=dict)
    slow_marks: int = 0


def run_loop(speedup: float, wakes: int, run_ahead: int, stalled: int | None = None) -> Seen:
    """RUNNING long requests; each keeping-up consumer takes everything it finds at a wake-up,
    then acks (the Generate stream's rule) until it woke `wakes` times; consumer `stalled` (if
    any) never takes a token."""

    async def main() -> Seen:
        args = EngineArgs(speedup_ratio=speedup, max_num_seqs=RUNNING)
        sched = long_running_scheduler(RUNNING, args, max_output_tokens=100_000)
        live = {f"bench-{i}": LiveRequest(f"bench-{i}", f"bench-{i}") for i in range(RUNNING)}
        loop = EngineLoop(sched, live, run_ahead)
        seen = Seen()
        done = asyncio.Event()
        remaining = [RUNNING - (1 if stalled is not None else 0)]

        async def consume(r: LiveRequest) -> None:
            running = asyncio.get_running_loop()
            counts = seen.per_wake.setdefault(r.key, [])
            got = seen.positions.setdefault(r.key, [])
            while True:
                if not r.tokens:
                    loop.ack(r)
                    fut = running.create_future()
                    r.waiter = fut
                    await fut
                    continue
                counts.append(len(r.tokens))
                got.extend(r.tokens)
                r.tokens.clear()
                loop.ack(r)
                time.sleep(WAKE_COST_S)  # the writes: some CPU, then a few loop turns
                for _ in range(3):
                    await asyncio.sleep(0)
                if len(counts) == wakes:
                    remaining[0] -= 1
                    if not remaining[0]:
                        done.set()

        async def never_takes(r: LiveRequest) -> None:
            while not done.is_set():
                seen.backlog_max[r.key] = len(r.tokens)
                await asyncio.sleep(0.01)

        async with asyncio.TaskGroup() as tg:
            consumers = [
                tg.create_task(never_takes(r) if i == stalled else consume(r))
                for i, r in enumerate(live.values())
            ]
            run = tg.create_task(loop.run())
            async with asyncio.timeout(60):
                await done.wait()
            for c in consumers:
                c.cancel()
            loop.stop()
            await run
        seen.slow_marks = loop.stats.slow_marks
        return seen

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main())


@pytest.mark.parametrize("speedup", [1000.0, 0.0])
def test_behind_schedule_each_wake_finds_k_tokens_never_more(speedup: float) -> None:
    seen = run_loop(speedup, wakes=200, run_ahead=K)
    for key, counts in seen.per_wake.items():
        assert max(counts) <= K, (key, counts[:50])  # the window bounds what a stream holds
        # The first wakes may find fewer (the first token comes from the prefill pass), and at
        # speedup 1000 so may the first after the clock restarts at now (RESYNC_MS): that pass
        # ends in the future, so it is slept to and handed out alone.
        full = sum(c == K for c in counts[5:200]) / 195
        assert full >= (1.0 if speedup == 0.0 else 0.9), (key, counts[:80])


def test_run_ahead_hands_the_same_tokens_in_the_same_order() -> None:
    """Only the grouping changes: the token sequence of each stream is the lock-step one."""
    batched = run_loop(0.0, wakes=50, run_ahead=K)
    lockstep = run_loop(0.0, wakes=50 * K, run_ahead=1)
    for key, toks in batched.positions.items():
        n = min(len(toks), len(lockstep.positions[key]))
        assert n >= 50 * K - K
        assert toks[:n] == lockstep.positions[key][:n], key


def test_on_schedule_every_wake_still_finds_one_token() -> None:
    """Passes of ~6 ms: a pass has not ended when it is run, so it is slept to and handed out
    alone (only a stall of the loaded machine longer than a pass leaves two passes due)."""
    seen = run_loop(1.0, wakes=40, run_ahead=K)
    for key, counts in seen.per_wake.items():
        assert max(counts) <= K, (key, counts)
        assert sum(c == 1 for c in counts[:40]) >= 32, (key, counts)


def test_a_consumer_that_stops_taking_does_not_hold_up_the_others() -> None:
    seen = run_loop(1000.0, wakes=200, run_ahead=K, stalled=0)
    assert seen.slow_marks >= 1
    assert seen.backlog_max["bench-0"] > 50  # the engine ran on: its tokens queued up
    for key, counts in seen.per_wake.items():
        if key != "bench-0":
            assert max(counts) <= K, (key, counts[:50])
            assert sum(c == K for c in counts[5:200]) / 195 >= 0.9, (key, counts[:80])
