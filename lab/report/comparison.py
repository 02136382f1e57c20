"""`lab compare` and `lab sweep --compare-disagg`: runs aligned by concurrency, deltas, sentences,
overlay plots and compare.md."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from lab.analysis import catalogue as cat
from lab.analysis import rundir
from lab.analysis.compare import (
    RunData,
    align,
    compare_sentences,
    level_axis,
    run_labels,
    table_rows,
)
from lab.analysis.timeline import TimelineError, run_timeline
from lab.report import compare_plots, plots
from lab.report.build import compute_levels, knee_of
from lab.report.html import write_html
from lab.report.markdown import md_table
from lab.report.shape import load_shape
from lab.report.shape_check import check_shapes

#: The metrics the terminal's comparison table shows, each with its delta: what a person reads
#: first. compare.md, compare.html and compare.csv have all of them.
TERMINAL_METRICS = tuple(c.name for c in (
    cat.REQ_S.col(), cat.TTFT.col("p50"), cat.LATENCY.col("p99"), cat.ITL.col("avg"),
    cat.SERVER_CPU_US_PER_TOKEN.col()))


@dataclass
class Comparison:
    runs: list[RunData]
    sentences: list[str]  # the throughput sentences, then any shape warning
    text: str  # compare.md's text (markdown): the table of every compared metric
    terminal: str  # what the terminal shows: the same with TERMINAL_METRICS only
    out_dir: Path
    plots: list[Path] = field(default_factory=list)


def load_run(path: Path) -> RunData:
    config = rundir.read_json(path / rundir.CONFIG, {}) or {}
    requests = rundir.read_requests(path)
    _, table = compute_levels(path, requests, config)
    name = (config.get("sweep") or {}).get("name") or path.name
    return RunData(label=name, path=path, levels=table, requests=requests, config=config)


def compare_runs(paths: list[Path], out_dir: Path, make_plots: bool = True) -> Comparison:
    runs = [load_run(Path(p)) for p in paths]
    labels = run_labels([(p.name if r.label is None else r.label, r.config)
                         for p, r in zip(paths, runs, strict=True)])
    for r, label in zip(runs, labels, strict=True):
        r.label = label
    sweeps = [(r.config or {}).get("sweep") or {} for r in runs]
    warnings = check_shapes(labels, sweeps)  # ShapeMismatch when no level can line up
    aligned = align(runs)
    sentences = compare_sentences(runs, aligned) + warnings
    header, rows = table_rows(runs, aligned)
    axis = level_axis(runs)
    knees = {} if axis != "concurrency" else {r.label: knee_of(r.levels) for r in runs}
    runs_line = ("Runs: " + "; ".join(f"{r.label} = {r.path} ({load_shape(s)})"
                                      for r, s in zip(runs, sweeps, strict=True))
                 + f". Deltas are against {runs[0].label}.")
    said = [s + "." for s in sentences] + [f"{label}: {k.sentence()}."
                                            for label, k in knees.items()]
    lines = [runs_line, "", md_table(header, rows), "",
             *"\n\n".join(said).splitlines()]  # a paragraph each
    short = md_table(*table_rows(runs, aligned, only=TERMINAL_METRICS))
    out_dir.mkdir(parents=True, exist_ok=True)
    made: list[Path] = []
    if make_plots and not aligned.empty:
        if axis == "concurrency":
            made.append(plots.compare_throughput([(r.label, r.levels) for r in runs],
                                                 out_dir / "throughput.png"))
        elif axis == "rate":
            made.append(compare_plots.compare_rates([(r.label, r.levels) for r in runs],
                                                    out_dir / "rates.png"))
        else:
            made.append(compare_plots.compare_timelines(
                [(r.label, _timeline(r.requests)) for r in runs if r.requests is not None],
                out_dir / "timelines.png"))
        made.append(plots.compare_latency([(r.label, r.levels) for r in runs],
                                          out_dir / "latency_vs_throughput.png",
                                          {k: v.knee for k, v in knees.items()} or None))
        made.append(plots.compare_ttft_cdf([(r.label, r.requests) for r in runs
                                            if r.requests is not None], out_dir / "ttft_cdf.png"))
    text = "\n".join(lines)
    terminal = "\n".join([runs_line, "", short, "", *said, "",
                          f"Every metric compared: {out_dir / 'compare.html'} (and .md, .csv)."])
    md = ["# Comparison", "", text, ""]
    for p in made:
        md += [f"![{p.stem}]({p.name})", ""]
    (out_dir / "compare.md").write_text("\n".join(md))
    write_html(out_dir / "compare.md")
    aligned.to_csv(out_dir / "compare.csv", index=False)
    return Comparison(runs=runs, sentences=sentences, text=text, terminal=terminal,
                      out_dir=out_dir, plots=made)


def _timeline(requests: pd.DataFrame) -> pd.DataFrame:
    """A run's time series, or none when its stamps are not on one clock (its own report says
    so: lab.analysis.timeline.MAX_LEVEL_SPAN_S)."""
    try:
        return run_timeline(requests)
    except TimelineError:
        return pd.DataFrame()
