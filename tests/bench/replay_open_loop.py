"""Replay the open-loop levels of a `lab fidelity` run offline, on engine args, and put the
figures beside the target's and the lab's measured ones:

    python -m tests.bench.replay_open_loop RUNS/suite --engine-args cal/engine-args.json \
        [--engine-args NAME=OTHER.json ...] [--fit cal/fit.json] [--passes]

Each open-loop level (a Poisson or gamma `--rate` level, e.g. the suite's `poisson-near-sat`)
is run again on the mocker's own `Scheduler` on a simulated clock, with the target's own send
times, prompt lengths (as the target counted them) and output lengths: what the lab stack
would do on that schedule, without the client, the path or the machine. Where the replay of
the engine args the lab side ran matches the lab's measured figures, the replay can score
other engine args against the target without running either (docs/fidelity.md "Open loop,
offline"). Prompts are distinct token runs: a prefix-reuse trace is not replayed.

`--passes` adds the target's and the lab's decode-only passes by batch size, read from the
client's token stamps: the tokens of one pass arrive within a millisecond of each other, so a
cluster of stamps is a pass, its token count the batch, and the time to the next cluster its
duration. Passes that held a first token (a prefill) are left out.

Nothing is sent anywhere: it reads what `lab fidelity` wrote.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np
import pandas as pd

from lab.analysis.request_times import with_request_times
from lab.fidelity.fit import path_at
from lab.fidelity.gaps import gap_pct
from lab.fidelity.probes import BURST_GAP_NS
from lab.report.markdown import md_table
from mocker.engine.config import EngineArgs
from mocker.engine.scheduler import EngineRequest, Scheduler
from mocker.engine.sim import timed_signals

#: batch-size buckets of the --passes table
BUCKETS = ((1, 4), (5, 9), (10, 19), (20, 29), (30, 44), (45, 64), (65, 100_000))
FIGURES = ("ttft_p50", "ttft_p99", "itl_p50", "latency_p50", "req_s")


@dataclass(frozen=True)
class Figures:
    """One level's figures, ms (req/s for req_s); ITL p50 is the median over requests of
    each one's mean gap between tokens, as `lab sweep` reports it."""

    ttft_p50: float
    ttft_p99: float
    itl_p50: float
    latency_p50: float
    req_s: float


def figures_of(streams: Sequence[np.ndarray], span_s: float) -> Figures:
    """Figures of measured requests given as token times in ms after each one's send."""
    ttft = [float(t[0]) for t in streams]
    itl = [float(t[-1] - t[0]) / (len(t) - 1) for t in streams if len(t) > 1]
    return Figures(statistics.median(ttft), float(np.quantile(ttft, 0.99)),
                   statistics.median(itl) if itl else math.nan,
                   statistics.median(float(t[-1]) for t in streams), len(streams) / span_s)


def measured(requests: pd.DataFrame) -> Figures:
    """A side's figures as `lab sweep` derives them (lab.analysis.request_times)."""
    m = with_request_times(requests[~requests["warmup"].astype(bool)])
    span_s = (m["end_ns"].max() - m["sent_ns"].min()) / 1e9
    return Figures(float(m["ttft_ms"].median()), float(m["ttft_ms"].quantile(0.99)),
                   float(m["itl_ms"].median()), float(m["latency_ms"].median()),
                   len(m) / span_s)


def replayed(requests: pd.DataFrame, engine_args: dict[str, Any], path_ms: float) -> Figures:
    """The level's requests (measured and warm-up) sent at the target's send times to a fresh
    scheduler; `path_ms` is added to each measured request's token times."""
    sched = Scheduler(EngineArgs.from_json(engine_args))
    rows = requests.sort_values("sent_ns")
    t0 = int(rows["sent_ns"].min())
    prompt = rows["input_tokens"] if "input_tokens" in rows else rows["isl_requested"]
    plan = [((int(s) - t0) / 1e6, int(p), int(o), bool(w)) for s, p, o, w in zip(
        rows["sent_ns"], prompt.fillna(rows["isl_requested"]), rows["output_tokens"],
        rows["warmup"], strict=True)]
    times: dict[str, list[float]] = {}
    done, nxt, now = 0, 0, 0.0
    while done < len(plan):
        while nxt < len(plan) and plan[nxt][0] <= now:
            at, isl, osl, _ = plan[nxt]
            before, after = sched.timing.request_parts_ms(isl)
            base = 1 + nxt * (isl + 1)  # distinct prompts: no prefix is reused
            sched.add(EngineRequest(f"r{nxt}", list(range(base, base + isl)), osl,
                                    lambda _p: 0, ready_at_ms=at + before,
                                    first_delay_ms=after))
            times[f"r{nxt}"] = []
            nxt += 1
        if not sched.has_work(now):
            wake = [t for t in (sched.next_ready_ms(now),
                                plan[nxt][0] if nxt < len(plan) else None) if t is not None]
            if not wake:
                raise RuntimeError("the replay stalled: no request can be scheduled")
            now = max(now, min(wake))
            continue
        res = sched.step(now)
        for at, s in timed_signals(res, now):
            if s.rejected:
                raise RuntimeError(f"the engine args reject request {s.key}")
            times[s.key].append(at)
            done += s.completed
        now += res.duration_ms
    streams, sends, ends = [], [], []
    for i, (at, _, _, warm) in enumerate(plan):
        if not warm:
            t = np.asarray(times[f"r{i}"])
            streams.append(t - at + path_ms)
            sends.append(at)
            ends.append(float(t[-1]))
    return figures_of(streams, (max(ends) - min(sends)) / 1e3)


def decode_passes(requests: pd.DataFrame) -> pd.DataFrame:
    """Passes read from token stamps: (duration ms, tokens, first tokens) per cluster of
    stamps less than a pass apart (`BURST_GAP_NS`)."""
    m = requests[~requests["warmup"].astype(bool)]
    stamps = sorted((int(t), i == 0) for times in m["chunk_times_ns"]
                    for i, t in enumerate(times))
    clusters: list[list[int]] = []  # [start, last, tokens, first tokens]
    for t, first in stamps:
        if not clusters or t - clusters[-1][1] > BURST_GAP_NS:
            clusters.append([t, t, 0, 0])
        clusters[-1][1] = t
        clusters[-1][2] += 1
        clusters[-1][3] += first
    return pd.DataFrame([((b[0] - a[0]) / 1e6, b[2], b[3])
                         for a, b in itertools.pairwise(clusters)],
                        columns=["ms", "tokens", "first"])


def levels(run_dir: Path, side: str) -> list[tuple[str, float, pd.DataFrame, pd.DataFrame]]:
    """(repeat directory, rate, target requests, lab requests) of every open-loop level but a
    trace's (its prompts share prefixes the replay does not know)."""
    out = []
    for target in sorted(run_dir.glob("**/target/requests.parquet")):
        lab_file = target.parent.parent / side / "requests.parquet"
        config = json.loads((target.parent / "config.json").read_text())
        if not lab_file.is_file() or config.get("sweep", {}).get("arrival") == "trace":
            continue
        t, lab = pd.read_parquet(target), pd.read_parquet(lab_file)
        if "rate" not in t or not t["rate"].notna().any():
            continue
        t, lab = t[t["ok"].astype(bool)], lab[lab["ok"].astype(bool)]
        where = str(target.parent.parent.relative_to(run_dir))
        for rate in sorted(t["rate"].dropna().unique()):
            out.append((where, float(rate), t[t["rate"] == rate], lab[lab["rate"] == rate]))
    return out


def _with_gap(target: float, value: float) -> str:
    return f"{value:,.2f} ({gap_pct(target, value):+.1f}%)"


def _args_option(values: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    out = {}
    for v in values:
        name, _, path = v.rpartition("=") if "=" in v else ("", "", v)
        try:
            out[name or Path(path).stem] = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise click.BadParameter(f"{path}: {exc}", param_hint="--engine-args") from exc
    return out


@click.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--engine-args", "engine_args", multiple=True, required=True,
              metavar="[NAME=]FILE", help="Engine args to replay on (repeatable).")
@click.option("--side", default="lab", show_default=True,
              help="The lab side whose measured figures go beside the replay.")
@click.option("--fit", "fit_json", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A calibration's fit.json: its lab path is added to each replayed request "
                   "(else none).")
@click.option("--passes", is_flag=True, help="Also the decode-only passes by batch size.")
def main(run_dir: Path, engine_args: tuple[str, ...], side: str, fit_json: Path | None,
         passes: bool) -> None:
    models = _args_option(engine_args)
    lab_path = ({int(k): float(v) for k, v in json.loads(fit_json.read_text())[
        "lab_path_ms"].items()} if fit_json else {})
    found = levels(run_dir, side)
    if not found:
        raise click.UsageError(f"{run_dir}: no open-loop level with a target and a {side!r} side")
    rows = []
    for where, rate, target, lab in found:
        prompt = float(target["input_tokens"].median()) if "input_tokens" in target else 0.0
        path = path_at(lab_path, prompt) if lab_path else 0.0
        t = measured(target)
        sides = {side: measured(lab)} | {f"replay {n}": replayed(target, a, path)
                                         for n, a in models.items()}
        rows.append([where, f"{rate:.3g}", "target",
                     *(f"{getattr(t, f):,.2f}" for f in FIGURES)])
        for name, x in sides.items():
            rows.append(["", "", name, *(_with_gap(getattr(t, f), getattr(x, f))
                                         for f in FIGURES)])
    click.echo(md_table(["run", "rate/s", "side", "TTFT p50", "TTFT p99", "ITL p50",
                         "latency p50", "req/s"], rows))
    if passes:
        click.echo("\nDecode-only passes by batch size (tokens in the pass): median ms, "
                   "passes in brackets\n")
        prow = []
        for where, rate, target, lab in found:
            for name, df in (("target", target), (side, lab)):
                p = decode_passes(df)
                p = p[p["first"] == 0]
                cells = []
                for lo, hi in BUCKETS:
                    b = p[(p["tokens"] >= lo) & (p["tokens"] <= hi)]["ms"]
                    cells.append(f"{b.median():.2f} ({len(b)})" if len(b) >= 5 else "")
                prow.append([where, f"{rate:.3g}", name, *cells])
        click.echo(md_table(["run", "rate/s", "side", *(f"{lo}-{hi}" if hi < 100_000 else
                                                        f"{lo}+" for lo, hi in BUCKETS)], prow))


if __name__ == "__main__":
    main()
