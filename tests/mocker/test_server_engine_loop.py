"""The engine loop's delivery rule (no sockets): on schedule, each pass is delivered at its own
end (one token per stream wake-up); behind schedule, the overdue passes run back to back in
one event-loop turn and each stream wakes once for all of them."""

from __future__ import annotations

import asyncio
import statistics
import time

import uvloop

from mocker.engine import EngineArgs
from mocker.engine.bench import long_running_scheduler
from mocker.server.engine_loop import EngineLoop
from mocker.server.inflight import LiveRequest

RUNNING = 4


#: What one wake-up of a stream costs (blocking, like a gRPC write): 4 streams make a loop
#: turn of ~2 ms, longer than a pass at speedup 1000 (~6 us), shorter than one at 1 (~6 ms).
WAKE_COST_S = 0.0005
#: Now and then a stream holds the loop for longer than a speedup-1 pass (~6 ms).
STALL_S = 0.015
STALL_EVERY = 20


def tokens_per_wake(speedup: float, seconds: float) -> list[int]:
    """Run the loop over RUNNING long requests; consumers record how many tokens they found
    at each wake-up."""

    async def main() -> list[int]:
        args = EngineArgs(speedup_ratio=speedup, max_num_seqs=RUNNING)
        sched = long_running_scheduler(RUNNING, args, max_output_tokens=100_000)
        live = {f"bench-{i}": LiveRequest(f"bench-{i}", f"bench-{i}") for i in range(RUNNING)}
        loop = EngineLoop(sched, live)
        seen: list[int] = []
        stop = asyncio.Event()

        async def consume(r: LiveRequest, stalls: bool) -> None:
            running = asyncio.get_running_loop()
            wakes = 0
            while not stop.is_set():
                fut = running.create_future()
                r.waiter = fut
                await fut
                if r.tokens:
                    seen.append(len(r.tokens))
                    r.tokens.clear()
                    wakes += 1
                    time.sleep(STALL_S if stalls and wakes % STALL_EVERY == 0 else WAKE_COST_S)

        async with asyncio.TaskGroup() as tg:
            for i, r in enumerate(live.values()):
                tg.create_task(consume(r, i == 0))
            run = tg.create_task(loop.run())
            await asyncio.sleep(seconds)
            stop.set()
            loop.stop()
            await run
            for r in live.values():
                r.wake()
        return seen

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main())


def test_on_schedule_every_pass_is_delivered_at_its_own_end():
    seen = tokens_per_wake(1.0, 0.5)  # passes of ~6 ms: the loop keeps up
    assert len(seen) >= RUNNING * 20, seen
    assert sum(1 for n in seen if n == 1) >= 0.8 * len(seen), seen
    # after a stall only the passes that are over go out together, never future ones
    assert max(seen) < 12, seen


def test_behind_schedule_the_overdue_passes_go_out_together():
    seen = tokens_per_wake(1000.0, 0.4)  # passes of ~6 us: far shorter than a loop turn
    assert statistics.mean(seen) > 20, seen[:50]
