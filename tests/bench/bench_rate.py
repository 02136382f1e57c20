"""Benchmark the open-loop client itself: the highest Poisson rate it keeps against the fake
one-chunk-per-token server (`tests.bench.fake_sse`, its own process), per client process.

    python -m tests.bench.bench_rate                            # rates 250,500,1000,1500, OSL 128
    python -m tests.bench.bench_rate --rate 400,800 --repeat 5 --client-procs 1,2

A rate is kept when the client sent at least 98% of the schedule's rate with dispatch lag p99 at
most 1 ms (`lab.open_loop.figures`, the same limits the report flags). Rounds alternate over the
rates (r1, r2, ..., r1, r2, ...); figures are medians over the rounds. With several
--client-procs counts, each gets its table and its ceiling (the rate one client process keeps).
"""

from __future__ import annotations

import statistics

import click
import uvloop

from lab.analysis.client_health import client_health
from lab.analysis.request_times import requests_frame
from lab.load.client_settings import ClientSettings
from lab.load.record import rows
from lab.load.workload import WorkloadSpec, build_requests
from lab.open_loop.arrival_settings import parse_rates
from lab.open_loop.arrivals import ArrivalProcess, schedule_seed
from lab.open_loop.client import run_rate_level
from lab.open_loop.figures import MAX_LAG_P99_MS, MIN_SENT_FRACTION, open_loop_figures
from tests.bench.load_bench import FakeServer

#: Seconds of arrivals per level at least (more when --requests asks for more).
MIN_LEVEL_S = 3.0


def _rates(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[float, ...]:
    try:
        return parse_rates(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _counts(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None
    if not counts or any(not 1 <= k <= 64 for k in counts):
        raise click.BadParameter(f"each count must be within 1..64 (got {value!r})")
    return counts


async def _one(url: str, model: str, rate: float, n: int, osl: int, procs: int,
               round_: int) -> dict:
    bodies = build_requests(WorkloadSpec(isl=136, osl=osl), model, n, level_seed=round_)
    seed = schedule_seed(round_, rate, 0)
    offsets = ArrivalProcess().schedule_ns(rate, n, seed)
    res = await run_rate_level(url, bodies, offsets, rate=rate, seed=seed,
                               options=ClientSettings(client_procs=procs))
    df = requests_frame(rows(res.records))
    fig = open_loop_figures(df)
    cl = client_health(res.procs, df)
    return {"sent": fig["sent_req_s"], "fraction": fig["sent_fraction"],
            "lag_p50": fig["dispatch_lag_ms_p50"], "lag_p99": fig["dispatch_lag_ms_p99"],
            "lag_max": fig["dispatch_lag_ms_max"], "cpu_ms": cl["cpu_ms_per_request"],
            "busiest": cl["cpu_pct_max_proc"], "loop_lag_p99": cl["loop_lag_p99_ms"],
            "errors": int((~df["ok"]).sum())}


@click.command()
@click.option("--rate", "rates", default="250,500,1000,1500", show_default=True,
              callback=_rates, help="Poisson rates (requests/s), comma-separated.")
@click.option("--requests", type=click.IntRange(min=10), default=1000, show_default=True,
              help=f"Requests per level (at least {MIN_LEVEL_S:g} s of arrivals).")
@click.option("--osl", type=click.IntRange(min=1), default=128, show_default=True,
              help="Output tokens per request (= SSE chunks from the fake server).")
@click.option("--repeat", type=click.IntRange(min=1), default=3, show_default=True,
              help="Rounds over the rates; the figures are medians.")
@click.option("--client-procs", "procs_list", default="1", show_default=True,
              callback=_counts,
              help="Client process counts the schedule is split over, comma-separated: a "
                   "table and a ceiling each.")
@click.option("--model", default="fake", show_default=True, help="Model name sent.")
def main(rates: tuple[float, ...], requests: int, osl: int, repeat: int,
         procs_list: tuple[int, ...], model: str) -> None:
    """Print, per Poisson rate, what the open-loop client sent and how late, and its ceiling."""
    server = FakeServer()
    try:
        for procs in procs_list:
            _bench(server.url, rates, requests, osl, repeat, procs, model)
    finally:
        server.stop()


def _bench(url: str, rates: tuple[float, ...], requests: int, osl: int, repeat: int, procs: int,
           model: str) -> None:
    runs: dict[float, list[dict]] = {r: [] for r in rates}
    click.echo(f"open-loop client benchmark against {url} (fake one-chunk-per-token "
               f"server), OSL {osl}, {procs} client process(es), {repeat} round(s), medians")
    for round_ in range(repeat):
        for rate in rates:
            n = max(requests, round(rate * MIN_LEVEL_S))
            runs[rate].append(uvloop.run(_one(url, model, rate, n, osl, procs, round_)))
    kept = []
    for rate in rates:
        med = {k: statistics.median(r[k] for r in runs[rate]) for k in runs[rate][0]}
        ok = med["fraction"] >= MIN_SENT_FRACTION and med["lag_p99"] <= MAX_LAG_P99_MS
        if ok:
            kept.append(rate)
        click.echo(f"rate={rate:<7g} sent {med['sent']:8.1f} req/s ({100 * med['fraction']:5.1f}%)"
                   f"  lag p50 {med['lag_p50']:.3f} p99 {med['lag_p99']:.3f} max "
                   f"{med['lag_max']:.2f} ms  client CPU {med['cpu_ms']:.3f} ms/req  busiest "
                   f"proc {med['busiest']:.0f}%  loop lag p99 {med['loop_lag_p99']:.2f} ms  "
                   f"errors {sum(r['errors'] for r in runs[rate])}"
                   f"  {'kept' if ok else 'NOT kept'}")
    ceiling = f"{max(kept):g} req/s" if kept else "below the lowest rate tried"
    click.echo(f"ceiling ({procs} process(es)): {ceiling} (kept = sent >= "
               f"{100 * MIN_SENT_FRACTION:.0f}% of the schedule and lag p99 <= "
               f"{MAX_LAG_P99_MS:g} ms)")


if __name__ == "__main__":
    main()
