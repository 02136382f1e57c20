"""The engine loop's delivery rule (no sockets): every pass hands each running stream one
token, and the next pass waits until the streams have taken theirs, so consumers that keep up
find exactly one token per wake-up at any speed; a consumer that stops taking is left behind
without holding up the others."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import uvloop

from mocker.engine import EngineArgs
from mocker.engine.pass_cost import long_running_scheduler
from mocker.server.engine_loop import EngineLoop
from mocker.server.inflight import LiveRequest

RUNNING = 4
#: What one wake-up of a stream costs (blocking, like a gRPC write): 4 streams make a loop
#: turn of ~2 ms, longer than a pass at speedup 1000 (~6 us), shorter than one at 1 (~6 ms).
WAKE_COST_S = 0.0005


@dataclass
class Seen:
    per_wake: dict[str, list[int]] = field(default_factory=dict)  # tokens found at each wake
    backlog_max: dict[str, int] = field(default_factory=dict)
    slow_marks: int = 0


def run_loop(speedup: float, wakes: int, stalled: int | None = None) -> Seen:
    """Run the loop over RUNNING long requests until every keeping-up consumer woke `wakes`
    times; consumer number `stalled` (if any) never takes a token."""

    async def main() -> Seen:
        args = EngineArgs(speedup_ratio=speedup, max_num_seqs=RUNNING)
        sched = long_running_scheduler(RUNNING, args, max_output_tokens=100_000)
        live = {f"bench-{i}": LiveRequest(f"bench-{i}", f"bench-{i}") for i in range(RUNNING)}
        loop = EngineLoop(sched, live)
        seen = Seen()
        done = asyncio.Event()
        remaining = [RUNNING - (1 if stalled is not None else 0)]

        async def consume(r: LiveRequest) -> None:
            running = asyncio.get_running_loop()
            counts = seen.per_wake.setdefault(r.key, [])
            while True:
                if not r.tokens:
                    loop.ack(r)
                    fut = running.create_future()
                    r.waiter = fut
                    await fut
                    continue
                counts.append(len(r.tokens))
                r.tokens.pop(0)
                loop.ack(r)
                time.sleep(WAKE_COST_S)  # a write: some CPU, then a few loop turns
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


def test_on_schedule_every_pass_is_one_token_per_wake():
    seen = run_loop(1.0, wakes=40)  # passes of ~6 ms: the loop keeps up
    for key, counts in seen.per_wake.items():
        assert counts[:40] == [1] * 40, (key, counts)


def test_behind_schedule_the_engine_is_paced_by_its_consumers():
    """Passes of ~6 us, wake-ups of ~0.5 ms: the engine waits for the streams, so each one
    still finds a single token (before the pacing it found ~100)."""
    seen = run_loop(1000.0, wakes=300)
    for key, counts in seen.per_wake.items():
        assert counts[:300] == [1] * 300, (key, counts[:50])


def test_at_speedup_zero_too():
    seen = run_loop(0.0, wakes=300)
    for key, counts in seen.per_wake.items():
        assert counts[:300] == [1] * 300, (key, counts[:50])


def test_a_consumer_that_stops_taking_does_not_hold_up_the_others():
    seen = run_loop(1000.0, wakes=300, stalled=0)
    assert seen.slow_marks >= 1
    stalled = seen.backlog_max["bench-0"]
    assert stalled > 50, stalled  # the engine ran on: its tokens queued up
    for key, counts in seen.per_wake.items():
        if key != "bench-0":
            assert counts[:300] == [1] * 300, (key, counts[:50])
