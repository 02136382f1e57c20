"""Benchmark the load client itself: client CPU per request and send delay, against a fast fake
server that streams one SSE chunk per token (`tests.bench.fake_sse`, started as a separate process
so its CPU is not the client's).

    python -m tests.bench.load_bench                 # c=1,32,256, 128-token streams, 3 repeats
    python -m tests.bench.load_bench --conc 256 --repeat 5
    python -m tests.bench.load_bench --target http://127.0.0.1:PORT --model NAME  # any server

The client runs in its own process (ClientSettings' default, not in_process_client) so its
CPU and loop-lag figures are its own. Budget: at most 1.5 ms of client CPU per 128-token
request, send delay p99 under 1 ms at concurrency 256. Figures per level are medians over the
repeats.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

from lab.analysis.client_health import client_health
from lab.analysis.request_times import requests_frame
from lab.load.client import run_level
from lab.load.client_settings import ClientSettings
from lab.load.workload import WorkloadSpec, build_requests
from lab.wire.ready import parse_ready

CPU_BUDGET_MS = 1.5
SEND_DELAY_BUDGET_MS = 1.0
READY_TIMEOUT_S = 30.0


class FakeServer:
    """`python -m tests.bench.fake_sse` in its own process group; stopped on exit."""

    def __init__(self, token_interval_ms: float = 0.0) -> None:
        self.log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed in stop())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.bench.fake_sse", "--listen", "127.0.0.1:0",
             "--token-interval-ms", str(token_interval_ms)],
            stdout=subprocess.DEVNULL, stderr=self.log, start_new_session=True)
        self.url = "http://" + self._wait_ready()

    def _wait_ready(self) -> str:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            self.log.seek(0)
            text = self.log.read()
            for line in text.splitlines():
                fields = parse_ready(line)
                if fields:
                    return fields["listen"]
            if self.proc.poll() is not None:
                raise click.ClickException(f"fake server exited before ready:\n{text[-2000:]}")
            time.sleep(0.05)
        self.stop()
        raise click.ClickException("fake server not ready in time")

    def cpu_s(self) -> float:
        """CPU seconds the server process used so far (from /proc)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self.log.close()


def _conc_list(_ctx: click.Context, param: click.Parameter, value: str) -> list[int]:
    try:
        levels = [int(v) for v in value.split(",") if v.strip()]
    except ValueError as exc:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from exc
    if not levels or any(c < 1 for c in levels):
        raise click.BadParameter(f"concurrencies must be >= 1, got {value!r}")
    return levels


async def _bench(url: str, model: str, levels: list[int], requests: int, osl: int, repeat: int,
                 procs: int, server: FakeServer | None) -> list[dict]:
    rows = []
    for c in levels:
        n = max(requests, 4 * c)
        bodies = build_requests(WorkloadSpec(isl=136, osl=osl), model, n + c, level_seed=c)
        runs = []
        for _ in range(repeat):
            s0 = server.cpu_s() if server else None
            res = await run_level(url, bodies, c, warmup=c,
                                  options=ClientSettings(client_procs=procs))
            errors = sum(1 for r in res.records if not r.ok)
            ok = [r for r in res.records if r.ok]
            cl = client_health(res.procs, requests_frame([r.row() for r in res.records]))
            runs.append({
                "cpu_ms": cl["cpu_ms_per_request"],
                "send_p99": cl["send_delay_p99_ms"],
                "lag_p99": cl["loop_lag_p99_ms"],
                "req_s": len(res.records) / cl["wall_s"],
                "cpu_pct": cl["cpu_pct"],
                "errors": errors,
                "chunks": statistics.mean(r.chunks for r in ok) if ok else 0.0,
                "server_ms": (1000 * (server.cpu_s() - s0) / len(res.records)
                              if server and s0 is not None else None),
            })
        med = {k: (statistics.median(v for v in (r[k] for r in runs) if v is not None)
                   if any(r[k] is not None for r in runs) else None) for k in runs[0]}
        med["errors"] = sum(r["errors"] for r in runs)
        med["c"] = c
        med["n"] = n + c
        med["cpu_runs"] = [r["cpu_ms"] for r in runs]
        rows.append(med)
        _print_row(med)
    return rows


def _print_row(r: dict) -> None:
    def f(v: float | None, d: int = 2) -> str:
        return "-" if v is None else f"{v:.{d}f}"

    runs = "/".join(f(v) for v in r["cpu_runs"])
    click.echo(f"c={r['c']:<4} {r['n']:>6} req  {f(r['req_s'], 0):>6} req/s  "
               f"chunks/req {f(r['chunks'], 0):>4}  client CPU {f(r['cpu_ms'], 3)} ms/req "
               f"({runs})  {f(r['cpu_pct'], 0)}%  send delay p99 {f(r['send_p99'], 3)} ms  "
               f"loop lag p99 {f(r['lag_p99'], 2)} ms  server CPU {f(r['server_ms'], 3)} ms/req  "
               f"errors {r['errors']}")


@click.command()
@click.option("--conc", "levels", default="1,32,256", show_default=True, callback=_conc_list,
              help="Comma-separated concurrency levels.")
@click.option("--requests", type=click.IntRange(min=1), default=2000, show_default=True,
              help="Measured requests per level (at least 4 per slot), plus one warm-up each.")
@click.option("--osl", type=click.IntRange(min=1), default=128, show_default=True,
              help="Output tokens per request (= SSE chunks from the fake server).")
@click.option("--repeat", type=click.IntRange(min=1), default=3, show_default=True,
              help="Runs per level; the figures are medians.")
@click.option("--client-procs", "procs", type=click.IntRange(min=1), default=1,
              show_default=True, help="Client processes per level.")
@click.option("--target", default=None, metavar="URL",
              help="Benchmark against this OpenAI server instead of launching the fake one.")
@click.option("--model", default="fake", show_default=True, help="Model name sent.")
@click.option("--token-interval-ms", type=click.FloatRange(min=0), default=0.0,
              show_default=True,
              help="The fake server's time between a stream's tokens; 0: as fast as it can. "
              "1 or more: every token arrives in its own read (the worst case per token).")
def main(levels: list[int], requests: int, osl: int, repeat: int, procs: int,
         target: str | None, model: str, token_interval_ms: float) -> None:
    """Print the load client's CPU per request and send delay p99 per concurrency level."""
    server = None if target else FakeServer(token_interval_ms)
    try:
        url = target or server.url  # type: ignore[union-attr]
        kind = "fake one-chunk-per-token server" if server else "external server"
        click.echo(f"client benchmark against {url} ({kind}), OSL {osl}, "
                   f"{repeat} run(s) per level, medians")
        rows = asyncio.run(_bench(url, model, levels, requests, osl, repeat, procs, server))
    finally:
        if server is not None:
            server.stop()
    worst = max((r["cpu_ms"] for r in rows if r["cpu_ms"] is not None), default=None)
    top = max(rows, key=lambda r: r["c"])
    worst_s = "-" if worst is None else f"{worst:.3f}"
    send_s = "-" if top["send_p99"] is None else f"{top['send_p99']:.3f}"
    click.echo(f"budget: client CPU <= {CPU_BUDGET_MS} ms/request (worst level: {worst_s} ms); "
               f"send delay p99 < {SEND_DELAY_BUDGET_MS} ms at the highest level "
               f"(c={top['c']}: {send_s} ms)")


if __name__ == "__main__":
    main()
