"""Benchmark the open-loop client against AIPerf 0.13 at the same rates and arrival process, on
a running target (the Dynamo anchor, outside this repository: `$ANCHORS/dynamo.sh up agg
--speedup 1000`):

    python -m tests.bench.bench_aiperf --anchors $ANCHORS --target http://127.0.0.1:8792 \
        --model mock-llama
    python -m tests.bench.bench_aiperf --anchors $ANCHORS --target URL --model M \
        --rate 200,300,400,500 --requests 2000

Per rate (the four given, or 0.6/0.8/1.0/1.2 x the throughput of a closed-loop `lab sweep`
level at c=32 first), it runs `lab sweep --target URL --rate R --arrival poisson` and
`aiperf.sh` (the anchors' scripts, `--anchors`) with `--request-rate R --arrival-pattern poisson`,
alternating which goes first from one rate to the next, with the same workload (streaming chat,
ISL 136 / OSL 128 exact in the anchor's tokenizer, ignore_eos + min_tokens), the same count of
measured requests, the same warm-up and the same cap on requests in flight (AIPerf's
`--concurrency` beside `--request-rate` is a cap; the lab's is `--max-concurrency`). It prints,
per rate and tool, the achieved rate (as AIPerf's request throughput: the measured requests
completed over the window from the first one's send to the last one's end; the lab's sent rate
beside it), TTFT p50 and the client's CPU per request: the lab's from its client process
(getrusage over the level), AIPerf's from its whole process tree (aiperf.sh samples every
AIPerf service process). AIPerf runs with AIPERF_LEAN_ARGS (no server-metrics scraping, no GPU
telemetry, summary export, WARNING logs): they cut its CPU per request, not its measurement.

Both tools' TTFT is the same interval: from a perf_counter_ns stamp taken before a pooled
connection is picked (AIPerf: before aiohttp's `session.request`, so its header and body
serialisation is inside; the lab: before its pre-built request's single write) to the arrival
of the first SSE event with non-empty content (AIPerf: `content_responses[0]`, stamped when its
chunk is read; the lab: `first_ns`, stamped in `data_received`). Both reuse the kept-alive
connection idle longest, so neither meets a server's delayed-ACK stall that the other avoids
(docs/open-loop.md "Against AIPerf").

With --rounds K, each rate runs both tools K times, alternating (round 1 in the rate's order,
each next round the other way round), each lab round with its own seed; a summary line per rate
gives each tool's median over rounds, its spread, and the ratios of the medians: one run of each
at one rate is too noisy to compare TTFT near saturation.

Where the target publishes vLLM's Prometheus metrics (`vllm:time_to_first_token_seconds`), every
run is also read on the server (tests/bench/server_metrics.py): its TTFT mean (and prefill time
mean) over the run's measured requests, from /metrics polled during the run, and the prefix-cache
hits over the run, which should be none when both tools' prompts are to be cold.

The target is not started or stopped here. Runs go under --out (one directory per run).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import click
import pandas as pd

from lab.fidelity.repeats import spread_pct
from lab.open_loop.arrival_settings import parse_rates
from tests.bench.server_metrics import MetricsPoller, ServerReading, has_vllm_ttft

#: The anchors' fixed workload (aiperf.sh: ISL 136, OSL 128, streaming chat).
ISL, OSL = 136, 128
#: Rates tried around the closed-loop throughput when --rate is not given.
AROUND_SATURATION = (0.6, 0.8, 1.0, 1.2)
#: The closed-loop level whose throughput the rates are placed around.
PROBE_CONCURRENCY = 32
#: AIPerf options that cut its client CPU without changing what it measures (same rate, arrival,
#: streaming workload, same TTFT and throughput definitions). py-spy on AIPerf 0.13 at 100 req/s
#: (docs/open-loop.md "Against AIPerf"): its server_metrics_manager scrapes and parses the
#: target's Prometheus /metrics all run long (~13% of AIPerf's CPU), its records_manager writes
#: every request to profile_export.jsonl (~5%; only the aggregate profile_export_aiperf.json is
#: read here), GPU telemetry polls DCGM endpoints that do not exist here, and INFO logging is
#: per-phase chatter. The rest, ~7 of 8 parts, is structural: the worker ships every SSE event of
#: every response over ZMQ to a record processor that parses each one again.
AIPERF_LEAN_ARGS = ("--no-server-metrics", "--no-gpu-telemetry", "--export-level", "summary",
                    "--log-level", "warning")
#: Requests `lab sweep --target` sends before its warm-up: the target check's one probe
#: (lab/load/target_check.py), which the server counts in its TTFT histogram too.
LAB_PROBE_REQUESTS = 1
#: The tools, in the order of a rate's first round at even rate indices.
TOOLS = ("lab", "aiperf")
#: How to start the vLLM anchor so that every run's prefills are cold.
NO_PREFIX_CACHING = "vllm.sh up --no-prefix-caching"


def _rates(_ctx: click.Context, _param: click.Parameter, value: str | None
           ) -> tuple[float, ...] | None:
    if value is None:
        return None
    try:
        rates = parse_rates(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return rates


def _lab(args: list[str]) -> None:
    lab = Path(sys.executable).parent / "lab"
    proc = subprocess.run([str(lab), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise click.ClickException(f"lab {' '.join(args)} failed ({proc.returncode}):\n"
                                   + (proc.stdout + proc.stderr)[-3000:])


def _lab_common(target: str, model: str, tokenizer: Path, out: Path, osl: int = OSL) -> list[str]:
    return ["sweep", "--target", target, "--model", model, "--endpoint", "chat", "--isl",
            str(ISL), "--osl", str(osl), "--tokenizer", str(tokenizer), "--prompt-kind", "text",
            "--out", str(out), "--quiet", "--no-plots"]


def probe_throughput(target: str, model: str, tokenizer: Path, out: Path, requests: int,
                     osl: int = OSL) -> float:
    """req/s of one closed-loop lab level at c=PROBE_CONCURRENCY."""
    _lab([*_lab_common(target, model, tokenizer, out, osl), "--conc", str(PROBE_CONCURRENCY),
          "--requests", str(requests)])
    return float(pd.read_csv(out / "levels.csv")["req_s"].iloc[0])


def run_lab(target: str, model: str, tokenizer: Path, out: Path, rate: float, requests: int,
            cap: int, seed: int, osl: int = OSL) -> dict:
    _lab([*_lab_common(target, model, tokenizer, out, osl), "--rate", f"{rate:g}", "--arrival",
          "poisson", "--requests", str(requests), "--warmup", str(cap), "--max-concurrency",
          str(cap), "--seed", str(seed)])
    row = pd.read_csv(out / "levels.csv").iloc[0]
    req = pd.read_parquet(out / "requests.parquet", columns=["warmup", "ok", "sent_ns",
                                                             "done_ns"])
    req = req[~req["warmup"]]
    window_s = (req["done_ns"].max() - req["sent_ns"].min()) / 1e9
    return {"achieved": float(req["ok"].sum() / window_s), "sent": float(row["sent_req_s"]),
            "completed": float(row["completed_req_s"]),
            "ttft_p50": float(row["ttft_ms_p50"]), "cpu_ms": float(row["client_cpu_ms_per_req"]),
            "errors": int(row.get("failed", 0) or 0)}


def _aiperf_own_rates(out: Path) -> tuple[float, float]:
    """AIPerf's issued and sent rates, (n - 1) / span, over its profiling records
    (profile_export.jsonl, written at --export-level records): the timing manager's credit
    issue stamps and the worker's request start stamps, as the lab's schedule and sent rates."""
    issued, started = [], []
    path = out / "profile_export.jsonl"
    if not path.exists():
        return float("nan"), float("nan")
    for line in path.read_text().splitlines():
        meta = json.loads(line).get("metadata") or {}
        if str(meta.get("benchmark_phase", "")).lower() != "profiling":
            continue
        if meta.get("credit_issued_ns"):
            issued.append(int(meta["credit_issued_ns"]))
        started.append(int(meta["request_start_ns"]))

    def rate(ns: list[int]) -> float:
        return (len(ns) - 1) / ((max(ns) - min(ns)) / 1e9) if len(ns) > 1 else float("nan")
    return rate(issued), rate(started)


def run_aiperf(anchors: Path, anchor_dir: Path, target: str, model: str, out: Path,
               rate: float, requests: int, cap: int, osl: int = OSL,
               records: bool = False) -> dict:
    # the client's CPU is what is compared; aiperf.sh finds its venv through ANCHOR_DIR;
    # OSL: aiperf.sh's --osl and min_tokens (ISL stays the anchors' 136)
    env = {**os.environ, "SERVER_PIDS": "", "ANCHOR_DIR": str(anchor_dir), "OSL": str(osl)}
    lean = list(AIPERF_LEAN_ARGS)
    if records:  # per-request records, to see whether AIPerf kept its schedule (~5% more CPU)
        lean[lean.index("summary")] = "records"
    proc = subprocess.run(
        [str(anchors / "aiperf.sh"), target, model, str(cap), str(requests), str(out),
         "--request-rate", f"{rate:g}", "--arrival-pattern", "poisson", *lean],
        capture_output=True, text=True, env=env)
    summary = out / "summary.json"
    if not summary.exists():
        raise click.ClickException(f"aiperf.sh failed ({proc.returncode}) at rate {rate:g}:\n"
                                   + (proc.stdout + proc.stderr)[-3000:])
    s = json.loads(summary.read_text())
    req_s = s.get("req_s") or 0.0
    cpu = s.get("client_cpu_pct")
    # The lab's window on AIPerf's own stamps: completed profiling requests over its
    # benchmark_duration (first request's send -> last response's end). AIPerf's own
    # request_throughput divides by its phase window instead (phase start -> last credit
    # returned to the timing manager), which also holds the first inter-arrival gap and the
    # worker -> timing-manager return hop.
    duration = s.get("duration_s") or 0.0
    window = s.get("completed", 0) / duration if duration else float("nan")
    issued, sent = _aiperf_own_rates(out) if records else (float("nan"), float("nan"))
    return {"achieved": float(window), "aiperf_req_s": float(req_s), "issued": issued,
            "sent": sent, "ttft_p50": float(s["ttft_p50_ms"]),
            "cpu_ms": 10.0 * cpu / req_s if cpu is not None and req_s else float("nan"),
            "errors": int(s.get("errors") or 0)}


def _server_column(reading: ServerReading | None) -> str:
    if reading is None or reading.ttft_ms is None:
        return "server TTFT mean n/a"
    prefill = "" if reading.prefill_ms is None else f" (prefill {reading.prefill_ms:.2f} ms)"
    return f"server TTFT mean {reading.ttft_ms:8.2f} ms{prefill}"


def _row(rate: float, tool: str, r: dict, tag: str = "") -> str:
    sent = "" if pd.isna(r["sent"]) else f" (sent {r['sent']:7.1f})"
    if not pd.isna(r.get("issued", float("nan"))):
        sent += f" (issued {r['issued']:7.1f})"
    if "aiperf_req_s" in r:
        sent += f" (its request_throughput {r['aiperf_req_s']:7.1f})"
    if "completed" in r:
        sent += f" (completions' own rate {r['completed']:7.1f})"
    return (f"rate={rate:<7g} {tag}{tool:6s} achieved {r['achieved']:7.1f} req/s{sent:16s} "
            f"TTFT p50 {r['ttft_p50']:8.2f} ms  client CPU {r['cpu_ms']:6.3f} ms/req  "
            f"errors {r['errors']}  {_server_column(r.get('server'))}")


def round_order(rate_index: int, round_index: int) -> tuple[str, ...]:
    """The tools in the order they run: the rates alternate which goes first (as with one
    round), and each next round of a rate flips its order, so that neither tool always meets
    the server just after the other's load."""
    first = TOOLS if rate_index % 2 == 0 else TOOLS[::-1]
    return first if round_index % 2 == 0 else first[::-1]


def run_dir(out: Path, tool: str, rate: float, round_index: int, rounds: int) -> Path:
    """`TOOL-R/` with one round, `TOOL-R-K/` (K from 1) with several."""
    name = f"{tool}-{rate:g}" if rounds == 1 else f"{tool}-{rate:g}-{round_index + 1}"
    return out / name


def summary_line(rate: float, runs: dict[str, list[dict]]) -> str:
    """Per tool the median over rounds of achieved rate and TTFT p50 (each with the tool's own
    spread) and of the server's TTFT mean where read, then lab / AIPerf of the medians."""
    medians: dict[str, dict[str, float]] = {}
    parts = []
    for tool in TOOLS:
        got = runs[tool]
        m = {key: statistics.median(r[key] for r in got) for key in ("achieved", "ttft_p50")}
        text = (f"{tool} achieved {m['achieved']:.1f} req/s "
                f"(spread {spread_pct([r['achieved'] for r in got]):.1f}%) TTFT p50 "
                f"{m['ttft_p50']:.2f} ms (spread {spread_pct([r['ttft_p50'] for r in got]):.1f}%)")
        server = [r["server"].ttft_ms for r in got
                  if r.get("server") is not None and r["server"].ttft_ms is not None]
        if len(server) == len(got):
            m["server"] = statistics.median(server)
            text += (f" server TTFT mean {m['server']:.2f} ms "
                     f"(spread {spread_pct(server):.1f}%)")
        medians[tool] = m
        parts.append(text)
    lab, ai = medians["lab"], medians["aiperf"]
    ratios = (f"achieved {lab['achieved'] / ai['achieved']:.3f}  "
              f"TTFT p50 {lab['ttft_p50'] / ai['ttft_p50']:.3f}")
    if "server" in lab and "server" in ai:
        ratios += f"  server TTFT mean {lab['server'] / ai['server']:.3f}"
    return (f"rate={rate:<7g} medians over {len(runs['lab'])} rounds: " + "; ".join(parts)
            + f"; lab/AIPerf of the medians: {ratios}")


def watched(run: Callable[[], dict], metrics_url: str | None, warmup: int) -> dict:
    """run()'s result, with "server": the server's reading of it when `metrics_url` is polled
    (None otherwise). `warmup`: the requests the tool sends before its measured ones."""
    if metrics_url is None:
        return {**run(), "server": None}
    with MetricsPoller(metrics_url) as poller:
        result = run()
    return {**result, "server": ServerReading.of(poller.snapshots, warmup)}


@click.command()
@click.option("--target", required=True, help="The running server's base URL.")
@click.option("--model", default="mock-llama", show_default=True, help="Model name served.")
@click.option("--rate", "rates", default=None, callback=_rates,
              help="Poisson rates (requests/s), comma-separated.  [default: 0.6, 0.8, 1.0, 1.2 "
                   f"x the throughput of a closed-loop level at c={PROBE_CONCURRENCY}]")
@click.option("--requests", type=click.IntRange(min=10, max=10_000_000), default=1000,
              show_default=True, help="Measured requests per run (both tools).")
@click.option("--max-concurrency", "cap", type=click.IntRange(min=1, max=100_000), default=256,
              show_default=True,
              help="Cap on requests in flight (both tools), and their warm-up requests.")
@click.option("--anchors", type=click.Path(file_okay=False, exists=True, path_type=Path),
              required=True,
              help="The anchors' scripts (aiperf.sh): the reference stack's directory, which is "
                   "not part of this repository.")
@click.option("--anchor-dir", type=click.Path(file_okay=False, path_type=Path),
              default=Path(os.environ.get("ANCHOR_DIR",
                                          Path.home() / ".cache" / "lab-anchors")),
              show_default=True, help="ANCHOR_DIR: its model/ is the tokenizer of both tools.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="A new directory for the runs: lab-R/, aiperf-R/ per rate R; with "
                   "--rounds K, lab-R-k/, aiperf-R-k/ for round k = 1..K.")
@click.option("--osl", type=click.IntRange(min=1, max=8192), default=OSL, show_default=True,
              help="Output tokens per request (both tools; ignore_eos + min_tokens).")
@click.option("--aiperf-records", is_flag=True,
              help="AIPerf writes per-request records: print its issued and sent rates.")
@click.option("--seed", type=click.IntRange(min=0, max=2**32 - 1), default=42,
              show_default=True,
              help="The lab's schedule seed, + k - 1 in round k (AIPerf's is aiperf.sh's 42).")
@click.option("--rounds", type=click.IntRange(min=1, max=1000), default=1, show_default=True,
              help="Runs of each tool per rate, alternating which goes first; a summary line "
                   "per rate gives the medians over rounds and their spread.")
def main(target: str, model: str, rates: tuple[float, ...] | None, requests: int, cap: int,
         anchors: Path, anchor_dir: Path, out: Path, osl: int, aiperf_records: bool,
         seed: int, rounds: int) -> None:
    """Print, per rate, the lab's and AIPerf's achieved rate, TTFT p50 and client CPU/request."""
    tokenizer = anchor_dir / "model"
    if not (tokenizer / "tokenizer.json").exists():
        raise click.BadParameter(f"no tokenizer.json in {tokenizer} (run setup.sh)",
                                 param_hint="'--anchor-dir'")
    if not (anchors / "aiperf.sh").exists():
        raise click.BadParameter(f"no aiperf.sh in {anchors}", param_hint="'--anchors'")
    if out.exists() and any(out.iterdir()):
        raise click.BadParameter(f"{out} is not empty", param_hint="'--out'")
    out.mkdir(parents=True, exist_ok=True)
    metrics_url = f"{target.rstrip('/')}/metrics"
    polled = metrics_url if has_vllm_ttft(metrics_url) else None  # once, before any run
    if rates is None:
        x = probe_throughput(target, model, tokenizer, out / "probe-c32", requests, osl)
        rates = tuple(round(f * x) for f in AROUND_SATURATION)
        click.echo(f"closed loop c={PROBE_CONCURRENCY}: {x:.1f} req/s; rates "
                   + ", ".join(f"{r:g}" for r in rates))
    click.echo(f"lab vs AIPerf against {target} ({model}): Poisson arrivals, {requests} requests "
               f"per run, warm-up {cap}, at most {cap} in flight, ISL {ISL} / OSL {osl} chat")
    # aiperf.sh fixes --random-seed 42 and AIPerf refuses the option twice ("specified multiple
    # times"), so its prompts are the same every run: against vLLM, not restarted between
    # rates, its second run's TTFT p50 was 25.6 ms against 103.6 in its first
    # (docs/references.md "AIPerf beside the lab on vLLM")
    click.echo("note: AIPerf sends the same prompts in every run (aiperf.sh's --random-seed 42): "
               "start a prefix-caching target without prefix caching (the vLLM anchor: "
               f"{NO_PREFIX_CACHING}) so that every round of both tools is cold")
    click.echo(f"server view: {metrics_url} has vLLM's TTFT histogram, polled during each run"
               if polled else
               f"server view: n/a ({metrics_url} has no vllm:time_to_first_token_seconds)")
    for k, rate in enumerate(rates):
        runs: dict[str, list[dict]] = {tool: [] for tool in TOOLS}
        for i in range(rounds):
            order = round_order(k, i)
            tag = "" if rounds == 1 else f"round {i + 1}/{rounds} "
            results = {}
            for tool in order:
                where = run_dir(out, tool, rate, i, rounds)
                run: Callable[[], dict]
                if tool == "lab":
                    run = partial(run_lab, target, model, tokenizer, where, rate, requests, cap,
                                  seed + i, osl)
                    warmup = cap + LAB_PROBE_REQUESTS
                else:
                    run = partial(run_aiperf, anchors, anchor_dir, target, model, where, rate,
                                  requests, cap, osl, aiperf_records)
                    warmup = cap
                results[tool] = watched(run, polled, warmup)
                reading: ServerReading | None = results[tool]["server"]
                if reading is not None and reading.prefix_hit_tokens:
                    click.echo(f"warning: the target's prefix cache served "
                               f"{reading.prefix_hit_tokens:.0f} prompt "
                               f"tokens during {tool}'s run at rate {rate:g} ({where.name}): "
                               "its prefills were not all cold; start the target without prefix "
                               f"caching (the vLLM anchor: {NO_PREFIX_CACHING})")
            lab, ai = results["lab"], results["aiperf"]
            for tool in TOOLS:
                runs[tool].append(results[tool])
                click.echo(_row(rate, tool, results[tool], tag))
            click.echo(f"rate={rate:<7g} {tag}lab/AIPerf: achieved "
                       f"{lab['achieved'] / ai['achieved']:.3f}  TTFT p50 "
                       f"{lab['ttft_p50'] / ai['ttft_p50']:.3f}  client CPU "
                       f"{lab['cpu_ms'] / ai['cpu_ms']:.3f}  (order: {' then '.join(order)})")
        if rounds > 1:
            click.echo(summary_line(rate, runs))


if __name__ == "__main__":
    main()
