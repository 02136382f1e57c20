"""`lab compare` and `lab sweep --compare-disagg`: runs aligned by concurrency, deltas, sentences,
overlay plots and compare.md."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from lab.analysis import rundir
from lab.analysis.compare import (
    RunData,
    align,
    compare_sentences,
    level_axis,
    run_labels,
    table_rows,
)
from lab.report import plots
from lab.report.build import compute_levels, knee_of
from lab.report.markdown import md_table


@dataclass
class Comparison:
    runs: list[RunData]
    sentences: list[str]
    text: str  # what the terminal shows (markdown)
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
    aligned = align(runs)
    sentences = compare_sentences(runs, aligned)
    header, rows = table_rows(runs, aligned)
    open_loop = level_axis(runs) == "rate"  # rates have no knee and no concurrency axis
    knees = {} if open_loop else {r.label: knee_of(r.levels) for r in runs}
    lines = ["Runs: " + "; ".join(f"{r.label} = {r.path}" for r in runs)
             + f". Deltas are against {runs[0].label}.", "", md_table(header, rows), ""]
    lines += [s + "." for s in sentences]
    lines += [f"{label}: {k.sentence()}." for label, k in knees.items()]
    out_dir.mkdir(parents=True, exist_ok=True)
    made: list[Path] = []
    if make_plots and not aligned.empty:
        if not open_loop:
            made.append(plots.compare_throughput([(r.label, r.levels) for r in runs],
                                                 out_dir / "throughput.png"))
        made.append(plots.compare_latency([(r.label, r.levels) for r in runs],
                                          out_dir / "latency_vs_throughput.png",
                                          {k: v.knee for k, v in knees.items()} or None))
        made.append(plots.compare_ttft_cdf([(r.label, r.requests) for r in runs
                                            if r.requests is not None], out_dir / "ttft_cdf.png"))
    text = "\n".join(lines)
    md = ["# Comparison", "", text, ""]
    for p in made:
        md += [f"![{p.stem}]({p.name})", ""]
    (out_dir / "compare.md").write_text("\n".join(md))
    aligned.to_csv(out_dir / "compare.csv", index=False)
    return Comparison(runs=runs, sentences=sentences, text=text, out_dir=out_dir, plots=made)
