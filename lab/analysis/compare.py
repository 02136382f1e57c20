"""Compare runs aligned by concurrency: deltas in percent against the first run, and a sentence
("disaggregated costs 4.1% throughput at 32, 11.8% at 128")."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from lab.analysis import catalogue as cat
from lab.analysis.catalogue import Column

#: The compared columns of by_concurrency levels (headings and better directions: the catalogue).
COMPARED: tuple[Column, ...] = (
    cat.REQ_S.col(),
    cat.OUT_TOK_S.col(),
    cat.LATENCY.col("avg"),
    cat.LATENCY.col("p99"),
    cat.TTFT.col("avg"),
    cat.TTFT.col("p50"),
    cat.TTFT.col("p99"),
    cat.ITL.col("avg"),
    cat.TOKENS_PER_CHUNK.col(),
    cat.SERVER_CPU_US_PER_TOKEN.col(),
    cat.CLIENT_CPU_US_PER_TOKEN.col(),
    cat.TOTAL_CPU_US_PER_TOKEN.col(),
)
#: Also compared when every run is open loop (levels aligned by rate; docs/open-loop.md).
OPEN_LOOP_COMPARED: tuple[Column, ...] = (
    cat.SENT_REQ_S.col(),
    cat.TTFT_INTENDED.col("p99"),
    cat.LATENCY_INTENDED.col("p99"),
    cat.DISPATCH_LAG.col("p99"),
)
#: A delta below this (%) is no change: "matches" in the sentence, no better/worse in the table.
NEGLIGIBLE_PCT = 0.05


@dataclass
class RunData:
    label: str
    path: Path | None
    levels: pd.DataFrame  # by_concurrency() rows
    requests: pd.DataFrame | None = None
    config: dict | None = None


def topology_mode(config: dict | None) -> str | None:
    """'aggregated' / 'disaggregated' from a run's config.json, 'target' for --target runs."""
    if not config:
        return None
    sweep = config.get("sweep") or {}
    if sweep.get("target"):
        return "target"
    topo = config.get("topology")
    if not topo:
        return None
    roles = {f.get("role") for f in topo.get("fleets", [])}
    if roles & {"prefill", "decode"}:
        return "disaggregated"
    return "aggregated"


def run_labels(runs: list[tuple[str, dict | None]]) -> list[str]:
    """Labels: topology modes when they tell the runs apart, else the run names."""
    modes = [topology_mode(cfg) for _, cfg in runs]
    if all(modes) and len(set(modes)) == len(modes):
        return [str(m) for m in modes]
    names = [name for name, _ in runs]
    if len(set(names)) == len(names):
        return names
    return [f"{name} ({i + 1})" for i, name in enumerate(names)]


def delta_pct(base: float | None, other: float | None) -> float | None:
    if base is None or other is None or pd.isna(base) or pd.isna(other) or base == 0:
        return None
    return 100.0 * (other / base - 1.0)


def level_axis(runs: list[RunData]) -> str:
    """'trace' when every run replays a trace (one level each, aligned whatever the trace's
    rate), 'rate' when every run is an open-loop sweep, else 'concurrency'."""
    if all(((r.config or {}).get("sweep") or {}).get("trace") for r in runs):
        return "trace"
    rated = all("rate" in r.levels and r.levels["rate"].notna().all() and len(r.levels)
                for r in runs)
    return "rate" if rated else "concurrency"


def compared(axis: str) -> tuple[Column, ...]:
    return COMPARED + OPEN_LOOP_COMPARED if axis in ("rate", "trace") else COMPARED


def _level(axis: str, value: Any) -> str:
    if axis == "trace":
        return "trace"
    return f"{float(value):g}/s" if axis == "rate" else str(int(value))


def _axis_of(aligned: pd.DataFrame) -> str:
    return next((a for a in ("trace", "rate") if a in aligned), "concurrency")


def align(runs: list[RunData]) -> pd.DataFrame:
    """One row per level (concurrency, or rate when every run is open loop) that the first run
    and at least one other share; for each compared metric the value of every run and each
    other run's delta (%) against the first."""
    axis = level_axis(runs)
    keep = [r.levels[r.levels["rate"].isna()] if axis == "concurrency" and "rate" in r.levels
            else r.levels for r in runs]  # an open-loop run shares no concurrency level
    if axis == "trace":  # a replay is one level: the runs' replays line up with each other
        keep = [k.assign(trace=0) for k in keep]
    base = keep[0].set_index(axis)
    others = [k.set_index(axis) for k in keep[1:]]
    concs = sorted(set(base.index).intersection(*[set(o.index) for o in others])) if others else []
    rows = []
    for c in concs:
        row: dict[str, Any] = {axis: c}
        for column in compared(axis):
            col = column.name
            b = base.at[c, col] if col in base else None
            row[f"{col}|{runs[0].label}"] = b
            for run, o in zip(runs[1:], others, strict=True):
                v = o.at[c, col] if col in o else None
                row[f"{col}|{run.label}"] = v
                row[f"{col}|{run.label}|delta_pct"] = delta_pct(b, v)
        rows.append(row)
    return pd.DataFrame(rows) if rows else pd.DataFrame(columns=[axis])


def _fmt_pct(x: float) -> str:
    return f"{abs(x):.1f}%"


def throughput_sentence(aligned: pd.DataFrame, base_label: str, label: str,
                        modes: bool = True) -> str:
    """'disaggregated costs 4.1% throughput at 32, 11.8% at 128' (and/or 'gains ...')."""
    col = f"{cat.REQ_S.name}|{label}|delta_pct"
    if aligned.empty or col not in aligned:
        axis = _axis_of(aligned)
        return f"{label} and {base_label} share no {axis} level: nothing to compare"
    axis = _axis_of(aligned)
    costs, gains, same = [], [], []
    for c, d in zip(aligned[axis], aligned[col], strict=True):
        if d is None or pd.isna(d):
            continue
        if abs(d) < NEGLIGIBLE_PCT:
            same.append(_level(axis, c))
        elif d < 0:
            costs.append((_level(axis, c), d))
        else:
            gains.append((_level(axis, c), d))

    def listing(items: list[tuple[str, float]]) -> str:
        first, *rest = items
        parts = [f"{_fmt_pct(first[1])} throughput at {first[0]}"]
        parts += [f"{_fmt_pct(d)} at {c}" for c, d in rest]
        return ", ".join(parts)

    clauses = []
    if costs:
        clauses.append("costs " + listing(costs))
    if gains:
        clauses.append("gains " + listing(gains))
    if same:
        clauses.append("matches throughput at " + ", ".join(same))
    if not clauses:
        return f"{label}: no throughput figures to compare"
    vs = "" if modes else f" (vs {base_label})"
    return f"{label}{vs} " + " and ".join(clauses)


def compare_sentences(runs: list[RunData], aligned: pd.DataFrame) -> list[str]:
    modes = all(topology_mode(r.config) for r in runs)
    return [throughput_sentence(aligned, runs[0].label, r.label, modes=modes) for r in runs[1:]]


def table_rows(runs: list[RunData], aligned: pd.DataFrame,
               only: tuple[str, ...] | None = None) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the comparison table: per metric, each run's value and deltas, a
    delta followed by 'better' or 'worse' when the metric has a better direction; `only`:
    these metrics (column names of `compared`), in that order."""
    axis = _axis_of(aligned)
    metrics = compared(axis)
    if only is not None:
        by_name = {column.name: column for column in metrics}
        metrics = tuple(by_name[name] for name in only if name in by_name)
    header = [{"rate": "Rate", "trace": "Level"}.get(axis, "Conc")]
    for column in metrics:
        header.append(f"{column.heading} ({runs[0].label})")
        for r in runs[1:]:
            header += [f"{column.heading} ({r.label})", "Δ%"]
    rows = []
    for _, a in aligned.iterrows():
        row = [_level(axis, a[axis])]
        for column in metrics:
            col = column.name
            row.append(_num(a.get(f"{col}|{runs[0].label}")))
            for r in runs[1:]:
                row.append(_num(a.get(f"{col}|{r.label}")))
                d = a.get(f"{col}|{r.label}|delta_pct")
                row.append("" if d is None or pd.isna(d) else _delta(d, column))
        rows.append(row)
    return header, rows


def _delta(d: float, column: Column) -> str:
    """'+33.3% worse', '-4.1%' (a metric with no better direction), '+0.0%'."""
    judged = column.judge(d, NEGLIGIBLE_PCT)
    return f"{d:+.1f}%" + (f" {judged}" if judged else "")


def _num(v: Any) -> str:
    if v is None or pd.isna(v):
        return "-"
    v = float(v)
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 100:
        return f"{v:.1f}"
    return f"{v:.2f}"
