"""Benchmark: CPU per streamed message of grpc.aio vs h2grpc, server and client side.

    python -m tests.bench.h2grpc_bench [--seconds 3] [--runs 3] [--conc 32,128] [--modes plain,step]

Server and client in separate processes, uvloop on
both, raw bytes (no protobuf), 128 small messages per server-streaming call, N concurrent calls
on one channel. Four pairings (server + client): aio+aio (the reference), h2+aio, aio+h2,
h2+h2. Two server modes:

* `plain` - the handler yields its 128 messages back to back (the reference script's `yield`);
* `step`  - like the engine: one shared "step" releases every stream's next message together
  (each handler awaits the step event before each yield), so all streams' messages are produced
  in the same event-loop turn.

Each client run is a fresh process (grpc.aio's poller thread must not run in the h2 client's
process). Runs are interleaved across pairings and the table shows medians over `--runs`.
Server CPU is sampled from outside (psutil) around the client's measured window only.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import resource
import statistics
import sys
import time
from typing import Any

MSG = b"\x0a\x05\x08\xe8\x07\x10\x01"  # a few bytes, like one TokenOutput
N_PER_CALL = 128
METHOD = "/b.B/S"
PAIRINGS = (("aio", "aio"), ("h2", "aio"), ("aio", "h2"), ("h2", "h2"))


class Stepper:
    """One engine step per loop turn while anyone waits: every waiting stream is released by
    the same `Event.set()`, so their next messages are all produced in one iteration."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.waiting = asyncio.Event()

    async def next(self) -> None:
        self.waiting.set()
        await self.event.wait()

    async def run(self) -> None:
        while True:
            await self.waiting.wait()
            await asyncio.sleep(0)  # let every stream that is ready join this step
            self.waiting.clear()
            event, self.event = self.event, asyncio.Event()
            event.set()


def _server_main(kind: str, mode: str, port_q: Any) -> None:
    import uvloop

    uvloop.install()

    async def run() -> None:
        import grpc
        import grpc.aio

        from lab.wire.h2grpc.server import H2GrpcServer

        stepper = Stepper()

        async def gen(request: bytes, context: Any) -> Any:
            if mode == "step":
                for _ in range(N_PER_CALL):
                    await stepper.next()
                    yield MSG
            else:
                for _ in range(N_PER_CALL):
                    yield MSG

        handler = grpc.method_handlers_generic_handler(
            "b.B", {"S": grpc.unary_stream_rpc_method_handler(gen)}
        )
        server: Any = grpc.aio.server() if kind == "aio" else H2GrpcServer()
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        step_task = asyncio.create_task(stepper.run())
        port_q.put(port)
        try:
            await server.wait_for_termination()
        finally:
            step_task.cancel()

    asyncio.run(run())


def _client_main(kind: str, port: int, conc: int, seconds: float, q: Any) -> None:
    import uvloop

    uvloop.install()

    async def run() -> tuple[int, int, float, float]:
        if kind == "aio":
            import grpc.aio

            channel: Any = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        else:
            from lab.wire.h2grpc.client import H2GrpcChannel

            channel = H2GrpcChannel(f"127.0.0.1:{port}")
        call = channel.unary_stream(METHOD)
        done = msgs = 0
        stop = 0.0

        async def worker() -> None:
            nonlocal done, msgs
            while time.perf_counter() < stop:
                async for _ in call(b""):
                    msgs += 1
                done += 1

        stop = time.perf_counter() + 0.3  # warm-up: connect, grow windows
        await asyncio.gather(*[worker() for _ in range(conc)])
        q.put("start")
        done = msgs = 0
        t0 = time.perf_counter()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        stop = t0 + seconds
        await asyncio.gather(*[worker() for _ in range(conc)])
        t1 = time.perf_counter()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        await channel.close()
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        return done, msgs, t1 - t0, cpu

    q.put(asyncio.run(run()))


def _measure(
    ctx: Any, server_proc: Any, kind: str, port: int, conc: int, seconds: float
) -> dict[str, float]:
    import psutil

    q = ctx.Queue()
    p = ctx.Process(target=_client_main, args=(kind, port, conc, seconds, q))
    p.start()
    sp = psutil.Process(server_proc.pid)
    assert q.get(timeout=60) == "start"
    c0 = sp.cpu_times()
    done, msgs, wall, ccpu = q.get(timeout=60 + seconds)
    c1 = sp.cpu_times()
    p.join(30)
    scpu = (c1.user - c0.user) + (c1.system - c0.system)
    return {
        "calls_s": done / wall,
        "msgs_s": msgs / wall,
        "server_us": scpu / msgs * 1e6,
        "client_us": ccpu / msgs * 1e6,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--conc", default="32,128")
    ap.add_argument("--modes", default="plain,step")
    args = ap.parse_args(argv)
    concs = [int(c) for c in args.conc.split(",")]
    ctx = mp.get_context("spawn")
    rows: list[tuple[str, int, str, str, dict[str, float]]] = []
    for mode in args.modes.split(","):
        servers = {}
        try:
            for kind in ("aio", "h2"):
                q = ctx.Queue()
                proc = ctx.Process(target=_server_main, args=(kind, mode, q), daemon=True)
                proc.start()
                servers[kind] = (proc, q.get(timeout=60))
            samples: dict[tuple[int, str, str], list[dict[str, float]]] = {}
            for run in range(args.runs):
                for conc in concs:
                    for skind, ckind in PAIRINGS:
                        proc, port = servers[skind]
                        r = _measure(ctx, proc, ckind, port, conc, args.seconds)
                        samples.setdefault((conc, skind, ckind), []).append(r)
                        print(
                            f"  run {run + 1} {mode} c={conc} {skind}+{ckind}: "
                            f"{r['msgs_s']:.0f} msg/s server {r['server_us']:.1f} "
                            f"client {r['client_us']:.1f} us/msg",
                            file=sys.stderr,
                        )
            for (conc, skind, ckind), rs in samples.items():
                med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
                rows.append((mode, conc, skind, ckind, med))
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.join(10)
    print(
        f"\n{N_PER_CALL} msgs/call, {len(MSG)}-byte messages, medians of {args.runs} runs "
        f"x {args.seconds:g} s\n"
    )
    print(
        f"{'mode':5} {'c':>4} {'server':6} {'client':6} {'calls/s':>8} {'msgs/s':>9} "
        f"{'srv us/msg':>10} {'cli us/msg':>10}"
    )
    for mode, conc, skind, ckind, m in rows:
        print(
            f"{mode:5} {conc:4d} {skind:6} {ckind:6} {m['calls_s']:8.0f} {m['msgs_s']:9.0f} "
            f"{m['server_us']:10.1f} {m['client_us']:10.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
