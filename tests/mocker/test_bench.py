"""`mocker bench` runs and prints its three figures (short durations)."""

from __future__ import annotations

import asyncio
import types

from click.testing import CliRunner

from mocker.cli import main
from mocker.engine import EngineArgs
from mocker.engine.pass_cost import long_running_scheduler
from mocker.server import engine_loop
from mocker.server.engine_loop import EngineLoop
from mocker.server.inflight import LiveRequest
from tests.waiting import wait_for


def test_bench_prints_pass_cost_drift_and_streaming_figures():
    result = CliRunner().invoke(
        main, ["bench", "--drift-seconds", "1", "--stream-seconds", "1", "--concurrency", "8"]
    )
    assert result.exit_code == 0, result.output
    out = result.output
    for n in (1, 32, 128, 256):
        assert out.count(f"{n:4d} running:") == 2  # step, then fast_forward
    assert "(b) drift at speedup 1, 256 running" in out
    assert "(c) streaming at concurrency 8" in out and "tokens/s" in out and " 0 errors" in out


class VirtualClock:
    """The engine loop's clock, advanced only by its own sleeps and by the scheduler's "cost".

    The wall-clock version of this check (`mocker bench`'s drift figure) depends on how busy
    the machine is; here every pass costs exactly OVERHEAD_MS of "Python time" and every sleep
    takes exactly as long as asked, so the property is checked, not the machine.
    """

    def __init__(self) -> None:
        self.ms = 0.0

    def now_ms(self) -> float:
        return self.ms

    async def sleep(self, seconds: float, result=None):
        self.ms += max(0.0, seconds) * 1000.0
        await asyncio.sleep(0)  # the real one: let the other tasks run
        return result


OVERHEAD_MS = 2.0  # per pass; a decode pass at 256 running simulates ~6-13 ms


async def test_engine_loop_keeps_simulated_time_with_absolute_deadlines(monkeypatch) -> None:
    clock = VirtualClock()
    monkeypatch.setattr(engine_loop, "_now_ms", clock.now_ms)
    fake_asyncio = types.SimpleNamespace(**vars(asyncio))
    fake_asyncio.sleep = clock.sleep
    monkeypatch.setattr(engine_loop, "asyncio", fake_asyncio)

    running = 256
    sched = long_running_scheduler(running, EngineArgs(speedup_ratio=1.0, max_num_seqs=running))
    live = {f"bench-{i}": LiveRequest(f"bench-{i}", f"bench-{i}") for i in range(running)}
    loop = EngineLoop(sched, live)
    for name in ("_deliver", "_deliver_burst"):  # handing out a pass's tokens costs OVERHEAD_MS
        real = getattr(loop, name)

        def costly(*args, _real=real, **kwargs):
            clock.ms += OVERHEAD_MS
            return _real(*args, **kwargs)

        setattr(loop, name, costly)

    async def consume() -> None:  # a consumer that keeps up, like the Generate streams
        while True:
            for r in live.values():
                if r.tokens:
                    r.tokens.clear()
                    loop.ack(r)
            await asyncio.sleep(0)

    async with asyncio.TaskGroup() as tg:
        run = tg.create_task(loop.run())
        consumer = tg.create_task(consume())
        await wait_for(lambda: loop.stats.simulated_ms >= 2000.0, 60, "2 s of simulated time")
        loop.stop()
        await run
        consumer.cancel()
    stats = loop.stats
    assert stats.passes > 100
    # Relative sleeps would add OVERHEAD_MS per pass (15-30% here); absolute deadlines absorb
    # it entirely while a pass costs less than it simulates.
    wall_ms = clock.ms
    drift = (wall_ms - stats.simulated_ms) / stats.simulated_ms
    assert abs(drift) < 0.01, (wall_ms, stats.simulated_ms, stats.passes)
