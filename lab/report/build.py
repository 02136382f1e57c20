"""Analyse a run directory: levels.csv/json, plots/*.png, report.md and report.html, from
requests.parquet (+ procs.parquet, client.json, config.json and events.jsonl when present).

`lab sweep` rewrites levels.csv/json after every level itself (lab.load.sweep.SweepRunner) and
calls `build_run` at the end; `lab report RUN` calls `build_run`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from lab.analysis import catalogue as cat
from lab.analysis import rundir
from lab.analysis.checks import TokenCheck, failed_levels, token_check
from lab.analysis.faults import FaultAnalysis, analyse_faults
from lab.analysis.knee import DEFAULT_THRESHOLD, Knee, find_knee
from lab.analysis.levels import level_label
from lab.analysis.metrics import by_concurrency, summarize_run
from lab.analysis.slo_share import SLOs
from lab.analysis.stats import cancelled_mask
from lab.analysis.timeline import TimelineError, recovery, run_timeline
from lab.analysis.turns import per_turn
from lab.open_loop import report as open_loop_report
from lab.open_loop.figures import is_open_loop, schedule_sentence, sustained_sentence
from lab.report import plots
from lab.report.html import write_html
from lab.report.markdown import build_report, delivery_sentence, fnum
from lab.report.shape import load_shape
from lab.report.slo import slo_lines
from lab.report.tokens import tokens_markdown
from lab.report.turns import turns_markdown


@dataclass
class RunAnalysis:
    run_dir: Path
    levels: pd.DataFrame  # one row per (concurrency, repeat)
    table: pd.DataFrame  # one row per concurrency (mean over repeats)
    knee: Knee
    config: dict
    plots: list[Path] = field(default_factory=list)
    faults: FaultAnalysis | None = None
    tokens: TokenCheck | None = None  # requested vs server-reported tokens
    turns: pd.DataFrame = field(default_factory=pd.DataFrame)  # per turn of a --turns run
    timeline_note: str | None = None  # why the run has no time series, when it has none
    slo_lines: list[str] = field(default_factory=list)  # goodput and the SLO edge (report.slo)


def knee_of(table: pd.DataFrame, threshold: float = DEFAULT_THRESHOLD) -> Knee:
    """The knee of a by_concurrency table, from its request throughput and mean latency."""
    req_s, latency = cat.REQ_S.name, cat.LATENCY.col("avg").name
    if table.empty or not {req_s, latency} <= set(table.columns):
        return find_knee([], [], [], threshold)
    t = table.dropna(subset=[req_s, latency])
    repeats = int(t["repeats"].min()) if "repeats" in t and len(t) else 1
    spread = None
    if repeats > 1 and {"req_s_min", "req_s_max"} <= set(t.columns):
        spread = float((100 * (t["req_s_max"] - t["req_s_min"]) / t[req_s]).max())
    return find_knee(list(t["concurrency"]), list(t[req_s]), list(t[latency]), threshold,
                     repeats=repeats, spread_pct=spread)


def stream_interval_of(config: dict) -> int | None:
    """The launched stack's stream interval (the largest of its token-streaming fleets: prefill
    fleets send one token); None for an external target."""
    fleets = [f for f in (config.get("topology") or {}).get("fleets", [])
              if f.get("role") != "prefill"]
    if (config.get("sweep") or {}).get("target") or not fleets:
        return None
    return max(int(f.get("stream_interval") or 1) for f in fleets)


def _slos(config: dict) -> SLOs | None:
    s = (config.get("sweep") or {}).get("slos") or {}
    return SLOs(**s) if s else None


def ramp_spans(requests: pd.DataFrame, ramp_up_s: float | None) -> list[tuple[int, int]]:
    """Each level's --ramp-up as (start, end) perf_counter_ns: from its first intended (or
    sent) request, `ramp_up_s` long; [] without a ramp."""
    if not ramp_up_s or requests.empty:
        return []
    first = requests["sent_ns"].astype("float64")
    if "intended_ns" in requests:
        first = requests["intended_ns"].astype("float64").fillna(first)
    keys = [k for k in ("concurrency", "rate", "repeat") if k in requests]
    starts = first.groupby([requests[k] for k in keys], dropna=False).min()
    return [(int(t), int(t + ramp_up_s * 1e9)) for t in starts if not pd.isna(t)]


def compute_levels(run_dir: Path, requests: pd.DataFrame | None = None,
                   config: dict | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """levels (per concurrency and repeat) and the table (per concurrency); `requests` as
    `rundir.read_requests` gives them, with the derived per-request figures."""
    run_dir = Path(run_dir)
    if requests is None:
        requests = rundir.read_requests(run_dir)
    config = config if config is not None else rundir.read_json(run_dir / rundir.CONFIG, {})
    clients = rundir.read_json(run_dir / rundir.CLIENT_JSON, {}) or {}
    procs = rundir.read_procs(run_dir)
    levels = summarize_run(requests, procs=procs, clients=clients, slos=_slos(config))
    return levels, by_concurrency(levels)


def _measured_counts(requests: pd.DataFrame) -> str:
    """The measured requests of each level, e.g. '100, 256, 1024' (in level order)."""
    if not len(requests) or "concurrency" not in requests:
        return "0"
    counts = requests[~requests["warmup"]].groupby("concurrency", sort=True).size()
    return ", ".join(str(int(n)) for n in counts)


def _setup_lines(config: dict, requests: pd.DataFrame) -> list[str]:
    sweep = config.get("sweep") or {}
    lines = []
    if sweep.get("target"):
        lines.append(f"target: {sweep['target']} (external; nothing launched), "
                     f"model {sweep.get('model')}")
    elif config.get("topology"):
        topo = config["topology"]
        fleets = ", ".join(f"{f.get('count', 1)}x {f.get('role')} (speedup {f.get('speedup')}, "
                           f"stream interval {f.get('stream_interval', 1)})"
                           for f in topo.get("fleets", []))
        lines.append(f"topology: {fleets}; router {topo.get('router')}; "
                     f"sockets {topo.get('sockets')}")
    if sweep:
        lines.append(f"load: {load_shape(sweep)}")
    wl = sweep.get("workload") or {}
    if sweep.get("trace"):
        lines.append(f"workload: the trace's lengths and blocks, {wl.get('endpoint')} endpoint, "
                     f"seed {wl.get('seed')}, stream={wl.get('stream')}")
    elif wl:
        lines.append(
            f"workload: ISL {wl.get('isl')} (stddev {wl.get('isl_stddev')}), OSL {wl.get('osl')} "
            f"(stddev {wl.get('osl_stddev')}), shared prefix {wl.get('shared_prefix')}, "
            f"{wl.get('prompt_kind')} prompts, seed {wl.get('seed')}, "
            f"stream={wl.get('stream')}")
    conv = sweep.get("conversations") or {}
    turns = conv.get("turns", 1)
    per_level = (f"{sweep['trace']['requests']} requests (the trace's)" if sweep.get("trace")
                 else f"{sweep['duration_s']:g} s" if sweep.get("duration_s")
                 else f"{sweep['requests']} conversations of {turns} turns "
                 f"({sweep['requests'] * turns} requests)"
                 if turns > 1 and sweep.get("requests") is not None
                 else f"{sweep['requests']} requests" if sweep.get("requests") is not None
                 else f"{_measured_counts(requests)} requests (--requests not given: the "
                 "default for each concurrency)")
    if sweep:
        warm = sweep.get("warmup")
        warm_txt = "one per slot (= the concurrency)" if warm is None else str(warm)
        lines.append(f"per level: {per_level} + warm-up {warm_txt}, "
                     f"repeat {sweep.get('repeat', 1)}, client processes "
                     f"{sweep.get('client_procs', 1)}")
    n_total = len(requests)
    n_ok = int(requests["ok"].sum()) if n_total else 0
    n_cancelled = int(cancelled_mask(requests).sum()) if n_total else 0
    cancelled = f", {n_cancelled} cancelled by the client" if n_cancelled else ""
    lines.append(f"requests recorded: {n_total} ({n_ok} ok, {n_total - n_ok - n_cancelled} "
                 f"failed{cancelled}, warm-up included)")
    machine = config.get("machine") or {}
    if machine:
        lines.append(f"machine: {machine.get('cpu_count')} CPUs ({machine.get('cpu_model')}), "
                     f"kernel {machine.get('kernel')}")
    return lines


def _remote_client_lines(clients: dict) -> list[str]:
    """Per level run on Ray client actors (lab.load.ray_client): their nodes, the clock
    offsets their stamps were corrected by and the bound of that correction, any actor lost."""
    lines = []
    for level, c in clients.items():
        if "clock_offsets_ns" not in c:
            continue
        offsets = [o / 1e3 for o in c["clock_offsets_ns"] if o is not None]
        lost = f"; lost: {'; '.join(c['lost'])}" if c.get("lost") else ""
        lines.append(
            f"client on Ray, level {level}: {c['procs']} actors on {len(set(c['nodes']))} nodes, "
            f"stamps corrected by clock offsets {min(offsets):,.1f} to {max(offsets):,.1f} us "
            f"(error bound <= {c['clock_error_ns_max'] / 1e3:,.1f} us){lost}")
    return lines


def build_run(run_dir: Path, *, title: str | None = None, make_plots: bool = True,
              knee_threshold: float | None = None) -> RunAnalysis:
    """Rebuild levels.*, plots, report.md and report.html of a run directory."""
    run_dir = Path(run_dir)
    requests = rundir.read_requests(run_dir)
    config = rundir.read_json(run_dir / rundir.CONFIG, {}) or {}
    levels, table = compute_levels(run_dir, requests, config)
    rundir.write_levels(run_dir, levels)
    threshold = knee_threshold or (config.get("sweep") or {}).get("knee_threshold") \
        or DEFAULT_THRESHOLD
    knee = knee_of(table, threshold)
    events = rundir.read_events(run_dir)
    faults = analyse_faults(requests, events) if any(
        e.get("event") == "fault" for e in events) else None
    timeline_note = None
    try:
        timeline = run_timeline(requests)
    except TimelineError as exc:
        timeline, timeline_note = pd.DataFrame(), str(exc)
    if not timeline.empty:
        timeline.to_parquet(run_dir / rundir.TIMELINE, index=False)
    open_loop = is_open_loop(table)
    if open_loop:
        knee = find_knee([], [], [], threshold)
    pdir = run_dir / rundir.PLOTS
    made: list[tuple[str, Path]] = []
    colors = plots.run_level_colors(requests)  # one colour per level on every plot
    if make_plots and not timeline.empty:
        binned = run_timeline(requests, level_bins=True)
        made.append(("Over time: sent, completed, in flight, TTFT", open_loop_report.timeline_plot(
            binned, pdir / "timeline.png", faults.fault_marks() if faults else None,
            int(timeline.attrs.get("origin_ns", 0)), colors,
            ramps=ramp_spans(requests, (config.get("sweep") or {}).get("ramp_up_s")))))
    if make_plots and not table.empty:
        if not open_loop:  # an open-loop run's levels are rates: see the open-loop section
            made.append(("Throughput vs concurrency",
                         plots.throughput_vs_concurrency(table, pdir / "throughput.png")))
        made.append(("Latency (avg, p99) vs throughput, knee marked",
                     plots.latency_vs_throughput(table, pdir / "latency_vs_throughput.png",
                                                 knee.knee, colors=colors)))
        made.append(("TTFT distribution per concurrency",
                     plots.ttft_distribution(requests, pdir / "ttft.png", colors=colors)))
        made.append(("Inter-chunk gap distribution",
                     plots.gap_distribution(requests, pdir / "chunk_gaps.png", colors=colors)))
        cpu = plots.server_cpu(table, pdir / "server_cpu.png")
        if cpu is not None:
            made.append(("CPU per process per level", cpu))
        if faults is not None:
            made.append(("Fault timeline", plots.fault_timeline(
                requests, faults.fault_marks(), pdir / "fault_timeline.png",
                markers=faults.worker_marks())))
    sweep = config.get("sweep") or {}
    slo = slo_lines(table, levels, knee, sweep, _slos(config))
    fault_md = faults.markdown() if faults is not None else None
    if faults is not None and fault_md is not None and not timeline.empty:
        fault_md += "\n" + open_loop_report.recovery_markdown(
            [recovery(requests, timeline, o.t_ns, f"{o.kind} {o.process}")
             for o in faults.outcomes if not o.resume])
    note = None
    if sweep.get("target"):
        note = ("Per-process server CPU is absent: this sweep ran against an external target "
                f"({sweep['target']}), so the lab launched no server process; name its "
                "processes with --server-pid NAME=PID to sample them.")
    elif rundir.read_procs(run_dir) is None:
        note = "Per-process server CPU is absent: the run directory has no procs.parquet."
    name = sweep.get("name") or run_dir.name
    tokens = token_check(requests, table, (sweep.get("workload") or {}).get("endpoint", ""))
    turns = per_turn(requests)
    report = build_report(
        title=title or f"Sweep {name}",
        setup=_setup_lines(config, requests) + _remote_client_lines(
            rundir.read_json(run_dir / rundir.CLIENT_JSON, {}) or {}),
        levels=table,
        knee=knee,
        plots=[(cap, str(p.relative_to(run_dir))) for cap, p in made],
        server_cpu_note=note,
        fault_md=fault_md,
        delivery=delivery_sentence(table, stream_interval_of(config)),
        failed_lines=failed_levels(requests) + ([timeline_note] if timeline_note else []),
        tokens_md=tokens_markdown(tokens) if tokens is not None else None,
        open_loop_md=open_loop_report.open_loop_markdown(
            table, sweep.get("arrival"), sweep.get("max_concurrency")) if open_loop else None,
        turns_md=turns_markdown(turns) if not turns.empty else None,
        slo_lines=slo,
    )
    (run_dir / rundir.REPORT).write_text(report)
    write_html(run_dir / rundir.REPORT)
    return RunAnalysis(run_dir, levels, table, knee, config, [p for _, p in made], faults,
                       tokens, turns, timeline_note, slo)


def summary_lines(analysis: RunAnalysis) -> list[str]:
    """Short terminal summary after the table."""
    t = analysis.table
    out = [] if is_open_loop(t) else [analysis.knee.sentence()]
    out += analysis.slo_lines
    out.append(delivery_sentence(t, stream_interval_of(analysis.config)))
    if not t.empty:
        req_s, out_tok_s = cat.REQ_S.name, cat.OUT_TOK_S.name
        best = t.loc[t[req_s].idxmax()] if t[req_s].notna().any() else None
        if best is not None:
            out.append(f"peak throughput {fnum(best[req_s])} req/s "
                       f"({fnum(best[out_tok_s], 0)} out tok/s) at {level_label(best)}")
    if is_open_loop(t):
        out += [schedule_sentence(t), sustained_sentence(t)]
    if analysis.timeline_note:
        out.append(analysis.timeline_note)
    return out
