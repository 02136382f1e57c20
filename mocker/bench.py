"""`mocker bench`: what one engine costs on this machine.

(a) pass cost: microseconds per scheduler pass at 1, 32, 128 and 256 running sequences
    (`mocker.engine.pass_cost.bench_pass_cost`);
(b) drift: the engine loop at speedup 1 with 256 running sequences for N seconds; drift =
    (wall time - simulated time) / simulated time (target: within 2%);
(c) streaming: tokens/s a `mocker serve --speedup-ratio 0` subprocess streams to a local
    grpc.aio client at concurrency 32 with 128-token requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass

from lab.wire.constants import DEFAULT_MODEL

PASS_SIZES = (1, 32, 128, 256)
DRIFT_RUNNING = 256


@dataclass
class DriftResult:
    wall_s: float
    simulated_s: float
    passes: int
    late_ms_max: float

    @property
    def drift(self) -> float:
        return (self.wall_s - self.simulated_s) / self.simulated_s if self.simulated_s else 0.0


@dataclass
class StreamResult:
    seconds: float
    requests: int
    tokens: int
    messages: int
    errors: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds


def pass_costs(sizes: tuple[int, ...] = PASS_SIZES) -> dict[int, float]:
    from mocker.engine.pass_cost import bench_pass_cost

    return {n: bench_pass_cost(n) for n in sizes}


def fast_forward_costs(sizes: tuple[int, ...] = PASS_SIZES) -> dict[int, float]:
    from mocker.engine.pass_cost import bench_fast_forward_cost

    return {n: bench_fast_forward_cost(n) for n in sizes}


async def measure_drift(seconds: float, running: int = DRIFT_RUNNING) -> DriftResult:
    """Run the real EngineLoop (with per-request delivery) at speedup 1 for `seconds`."""
    from mocker.engine import EngineArgs
    from mocker.engine.pass_cost import long_running_scheduler
    from mocker.server.engine_loop import EngineLoop
    from mocker.server.inflight import LiveRequest

    sched = long_running_scheduler(running, EngineArgs(speedup_ratio=1.0, max_num_seqs=running))
    live = {f"bench-{i}": LiveRequest(f"bench-{i}", f"bench-{i}") for i in range(running)}
    loop = EngineLoop(sched, live)

    async def drain() -> None:  # a consumer that keeps up, like the Generate streams
        while not stop:
            await asyncio.sleep(0.05)
            for r in live.values():
                r.tokens.clear()

    stop = False
    t0 = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        run = tg.create_task(loop.run())
        tg.create_task(drain())
        await asyncio.sleep(seconds)
        loop.stop()
        await run
        wall = time.perf_counter() - t0
        stop = True
    return DriftResult(wall, loop.stats.simulated_ms / 1000.0, loop.stats.passes,
                       loop.stats.late_ms_max)


def _start_server() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "mocker", "serve", "--listen", "127.0.0.1:0",
         "--speedup-ratio", "0", "--log-level", "info"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stderr is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        m = re.search(r"ready role=engine .*listen=(\S+)", line)
        if m:
            return proc, m.group(1)
    proc.kill()
    raise RuntimeError("mocker serve did not become ready")


async def stream_throughput(
    address: str, concurrency: int, tokens: int, seconds: float, warmup_s: float = 1.0
) -> StreamResult:
    import grpc

    from lab.wire.gen.openengine.v1 import generation_pb2 as g
    from lab.wire.gen.openengine.v1 import openengine_pb2_grpc as og

    counter = itertools.count()
    prompt = g.TokenIds(ids=list(range(1000, 1128)))
    stopping = g.StoppingOptions(max_tokens=tokens)
    totals = {"requests": 0, "tokens": 0, "messages": 0, "errors": 0}
    measuring = False
    async with grpc.aio.insecure_channel(address) as channel:
        stub = og.InferenceStub(channel)

        async def worker(end: float) -> None:
            while time.perf_counter() < end:
                req = g.GenerateRequest(
                    request_id=f"bench-{next(counter)}", model=DEFAULT_MODEL,
                    token_ids=prompt, stopping=stopping,
                )
                n = m = 0
                ok = False
                async for resp in stub.Generate(req):
                    kind = resp.WhichOneof("event")
                    if kind == "token":
                        n += len(resp.token.tokens)
                        m += 1
                    elif kind == "finished":
                        ok = True
                if measuring:
                    totals["requests"] += 1
                    totals["tokens"] += n
                    totals["messages"] += m
                    totals["errors"] += 0 if ok else 1

        async with asyncio.TaskGroup() as tg:
            for _ in range(concurrency):
                tg.create_task(worker(time.perf_counter() + warmup_s))
        measuring = True
        t0 = time.perf_counter()
        async with asyncio.TaskGroup() as tg:
            for _ in range(concurrency):
                tg.create_task(worker(t0 + seconds))
        elapsed = time.perf_counter() - t0
    return StreamResult(elapsed, totals["requests"], totals["tokens"], totals["messages"],
                        totals["errors"])


def run_bench(
    *, drift_seconds: float, concurrency: int, tokens: int, stream_seconds: float, parts: set[str]
) -> None:
    import uvloop

    cpus = os.cpu_count()
    print(f"mocker bench on {cpus} CPU(s), Python {sys.version.split()[0]}")
    if "pass" in parts:
        print("(a) scheduler pass cost (speedup 0, decode passes):")
        for n, us in pass_costs().items():
            print(f"    {n:4d} running: {us:9.1f} us/pass  ({us / n:6.2f} us/sequence)")
        print("    the same decode passes run by fast_forward (catching up, e.g. speedup 1000):")
        for n, us in fast_forward_costs().items():
            print(f"    {n:4d} running: {us:9.1f} us/pass  ({us / n:6.2f} us/sequence)")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        if "drift" in parts:
            d = runner.run(measure_drift(drift_seconds))
            print(
                f"(b) drift at speedup 1, {DRIFT_RUNNING} running, {d.wall_s:.2f} s wall: "
                f"simulated {d.simulated_s:.3f} s over {d.passes} passes, drift "
                f"{d.drift * 100:+.2f}% (target within 2%), worst lateness {d.late_ms_max:.2f} ms"
            )
        if "stream" in parts:
            proc, address = _start_server()
            try:
                s = runner.run(stream_throughput(address, concurrency, tokens, stream_seconds))
            finally:
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(10)
                if proc.poll() is None:
                    proc.kill()
            print(
                f"(c) streaming at concurrency {concurrency}, {tokens}-token requests, speedup 0: "
                f"{s.tokens_per_s:,.0f} tokens/s, {s.requests_per_s:,.1f} requests/s, "
                f"{s.tokens / max(s.messages, 1):.2f} tokens per TokenOutput, {s.errors} errors"
            )

