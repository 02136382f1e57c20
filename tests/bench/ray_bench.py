"""Benchmark the Ray client against local client processes on one machine: client CPU per
request, dispatch lag (send delay) p99 and loop lag p99 of the same levels against the same
fast fake server (`tests.bench.load_bench.FakeServer`), and the clock-offset error bound of each Ray
actor (docs/ray.md "Overhead and clocks").

    python -m tests.bench.ray_bench                       # 3 local nodes (ray.cluster_utils)
    python -m tests.bench.ray_bench --conc 32,128 --repeat 3
    python -m tests.bench.ray_bench --ray HOST:PORT        # an existing cluster

Both arms run K client processes (--procs, default 3): `--client-procs K` children here, and K
Ray actors (one per node, SPREAD). Figures are medians over the repeats; CPU is each client
process's own getrusage over its level window, so the Ray arm includes the Ray worker's own
threads (that is its overhead).
"""

from __future__ import annotations

import asyncio
import os
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from lab.analysis.client_health import client_health
from lab.analysis.request_times import requests_frame
from lab.load.client import RemoteClients, run_level
from lab.load.client_settings import ClientSettings
from lab.load.ray_client import RayClientPool
from lab.load.ray_settings import RaySettings
from lab.load.record import rows
from lab.load.workload import WorkloadSpec, build_requests
from lab.shared.ray_connect import ray_environment
from tests.bench.load_bench import FakeServer

BENCH_NODE_CPUS = 1


@contextmanager
def _cluster(address: str | None, nodes: int) -> Iterator[str]:
    """The cluster's address: the one given, or `nodes` local nodes started (and stopped)."""
    if address:
        yield address
        return
    ray_environment()
    from ray.cluster_utils import Cluster

    args: dict[str, Any] = {"num_cpus": BENCH_NODE_CPUS, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, connect=False, head_node_args=args)
    try:
        for _ in range(nodes - 1):
            cluster.add_node(**args)
        cluster.wait_for_nodes()
        yield str(cluster.address)
    finally:
        cluster.shutdown()


async def _level(url: str, c: int, n: int, osl: int, procs: int,
                 remote: RemoteClients | None) -> dict[str, Any]:
    bodies = build_requests(WorkloadSpec(isl=136, osl=osl), "fake", n + c, level_seed=c)
    res = await run_level(url, bodies, c, warmup=c,
                          options=ClientSettings(client_procs=procs), remote=remote)
    cl = client_health(res.procs, requests_frame(rows(res.records)))
    return {"cpu_ms": cl["cpu_ms_per_request"], "send_p99": cl["send_delay_p99_ms"],
            "lag_p99": cl["loop_lag_p99_ms"],
            "errors": sum(1 for r in res.records if not r.ok),
            "clock_error_us": (cl["clock_error_ns_max"] / 1e3
                               if "clock_error_ns_max" in cl else None)}


def _median(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r[key] is not None]
    return statistics.median(values) if values else None


def _row(arm: str, c: int, runs: list[dict]) -> str:
    def f(v: float | None, d: int = 3) -> str:
        return "-" if v is None else f"{v:.{d}f}"

    clock = _median(runs, "clock_error_us")
    return (f"{arm:<14} c={c:<4} client CPU {f(_median(runs, 'cpu_ms'))} ms/req  "
            f"dispatch lag p99 {f(_median(runs, 'send_p99'))} ms  loop lag p99 "
            f"{f(_median(runs, 'lag_p99'), 2)} ms  errors {sum(r['errors'] for r in runs)}"
            + ("" if clock is None else f"  clock error bound max {clock:.1f} us"))


@click.command()
@click.option("--conc", default="32,128", show_default=True, help="Comma-separated levels.")
@click.option("--requests", type=click.IntRange(1, 10**6), default=1000, show_default=True,
              help="Measured requests per level, plus one warm-up per slot.")
@click.option("--osl", type=click.IntRange(1, 100_000), default=128, show_default=True,
              help="Output tokens per request (SSE chunks from the fake server).")
@click.option("--repeat", type=click.IntRange(1, 100), default=3, show_default=True,
              help="Runs per level and arm; figures are medians.")
@click.option("--procs", type=click.IntRange(1, 64), default=3, show_default=True,
              help="Client processes per arm (and local Ray nodes without --ray).")
@click.option("--ray", "address", default=None, metavar="HOST:PORT",
              help="An existing Ray cluster (default: start --procs local nodes).")
def main(conc: str, requests: int, osl: int, repeat: int, procs: int,
         address: str | None) -> None:
    """Print client CPU per request, dispatch lag p99 and the clock-offset error bound for
    local client processes and for Ray client actors, per level."""
    try:
        levels = [int(v) for v in conc.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{conc!r}: expected integers, e.g. 32,128",
                                 param_hint="'--conc'") from None
    if not levels or min(levels) < procs:
        raise click.BadParameter(f"{conc!r}: every level needs at least --procs {procs} slots",
                                 param_hint="'--conc'")
    click.echo(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} "
               f"{os.getloadavg()[2]:.2f}; {os.cpu_count()} CPUs")
    server = FakeServer()
    try:
        with _cluster(address, procs) as addr, RayClientPool(RaySettings(
                ray=addr, ray_client_nodes=procs, ray_client_cpus=BENCH_NODE_CPUS)) as pool:
            for c in levels:
                n = max(requests, 4 * c)
                for arm, remote in (("client-procs", None), ("ray", pool)):
                    runs = [asyncio.run(_level(server.url, c, n, osl, procs, remote))
                            for _ in range(repeat)]
                    click.echo(_row(arm, c, runs))
    finally:
        server.stop()
    click.echo(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
