"""One table of the lab's gaps against several references (a real engine, Dynamo's mocker):

    python -m tests.bench.references --run vLLM=RUNS/suite --run "Dynamo 136/128"=RUNS/dyn-136 \
        --run "Dynamo 1024/64"=RUNS/dyn-1024

Each --run NAME=DIR (split at its last "=") is a `lab fidelity` run directory: a `--suite`
run (suite.json) or a one-shape run (fidelity.json), with or without --repeat. Per reference,
workload and level it prints the gap of one lab side (--side, default `lab`: the engine args
given with --engine-args) on TTFT p50, TTFT p99, ITL p50, latency p50 and req/s, with the
target's own spread over the repeats in brackets where there is one; then per reference the
mean absolute gap, the share of gaps within 15% and the share within the target's spread.
Nothing is run: it reads what `lab fidelity` wrote (docs/fidelity.md "`lab fidelity`").
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import click

from lab.fidelity.gaps import METRICS
from lab.report.markdown import md_table

#: the metrics of the table, in its column order (ids of lab.fidelity.gaps.METRICS)
COLUMNS = ("ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "latency_ms_p50", "req_s")
FLOOR_PCT = 15.0


@dataclass(frozen=True)
class Cell:
    reference: str
    workload: str
    level: str
    metric: str
    gap_pct: float
    spread_pct: float


def cells_of(name: str, run_dir: Path, side: str) -> list[Cell]:
    """The gaps of `side` in a `lab fidelity` run directory (suite.json or fidelity.json)."""
    suite, single = run_dir / "suite.json", run_dir / "fidelity.json"
    if suite.is_file():
        doc = json.loads(suite.read_text())
        if side not in doc["sides"]:
            raise click.BadParameter(f"{run_dir}: no lab side {side!r} (has "
                                     f"{', '.join(doc['sides'])})", param_hint="--side")
        return [Cell(name, r["workload"], r["level"], r["metric"],
                     _num(r["sides"][side]["gap_pct"]), _num(r["target_spread_pct"]))
                for r in doc["rows"] if side in r["sides"]]
    if single.is_file():
        doc = json.loads(single.read_text())
        if side not in doc["gaps"]:
            raise click.BadParameter(f"{run_dir}: no lab side {side!r} (has "
                                     f"{', '.join(doc['gaps'])})", param_hint="--side")
        workload = _shape(run_dir)
        return [Cell(name, workload, g.get("level") or f"c={g['concurrency']}", g["metric"],
                     _num(g["gap_pct"]), _num(g.get("target_spread_pct")))
                for g in doc["gaps"][side]]
    raise click.BadParameter(f"{run_dir}: neither suite.json nor fidelity.json (not a "
                             "finished `lab fidelity` run directory)", param_hint="--run")


def _shape(run_dir: Path) -> str:
    config = json.loads((run_dir / "config.json").read_text()) \
        if (run_dir / "config.json").is_file() else {}
    workload = config.get("fidelity", {}).get("workload", {})
    isl, osl = workload.get("isl"), workload.get("osl")
    return f"isl{isl}-osl{osl}" if isl and osl else run_dir.name


def _num(v: object) -> float:
    try:
        return float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def _cell_text(c: Cell | None) -> str:
    if c is None or not math.isfinite(c.gap_pct):
        return "-"
    spread = f" ({c.spread_pct:.0f}%)" if math.isfinite(c.spread_pct) else ""
    return f"{c.gap_pct:+.1f}%{spread}"


def table(cells: list[Cell]) -> str:
    labels = dict(METRICS)
    keys: list[tuple[str, str, str]] = []
    for c in cells:
        if (c.reference, c.workload, c.level) not in keys:
            keys.append((c.reference, c.workload, c.level))
    by = {(c.reference, c.workload, c.level, c.metric): c for c in cells}
    rows = [[ref, wl, lv, *[_cell_text(by.get((ref, wl, lv, m))) for m in COLUMNS]]
            for ref, wl, lv in keys]
    main = md_table(["reference", "workload", "level", *[labels[m] for m in COLUMNS]], rows)
    summary = []
    for ref in dict.fromkeys(c.reference for c in cells):
        gaps = [c for c in cells if c.reference == ref and c.metric in COLUMNS
                and math.isfinite(c.gap_pct)]
        spread = [c for c in gaps if math.isfinite(c.spread_pct)]
        mean = sum(abs(c.gap_pct) for c in gaps) / len(gaps) if gaps else math.nan
        floor = 100.0 * sum(abs(c.gap_pct) <= FLOOR_PCT for c in gaps) / len(gaps) \
            if gaps else math.nan
        inside = sum(abs(c.gap_pct) <= c.spread_pct for c in spread)
        within = f"{100.0 * inside / len(spread):.0f}%" if spread else "-"
        summary.append([ref, str(len(gaps)), f"{mean:.1f}%", f"{floor:.0f}%", within])
    return "\n".join([main, "", md_table(
        ["reference", "gaps", "mean |gap|", f"within {FLOOR_PCT:g}%",
         "within the target's spread"], summary)])


@click.command()
@click.option("--run", "runs", multiple=True, required=True, metavar="NAME=DIR",
              help="A reference's name and its `lab fidelity` run directory; repeatable.")
@click.option("--side", default="lab", show_default=True,
              help="The lab side whose gaps are shown (lab, lab-defaults, or an "
                   "--also-engine-args name).")
def main(runs: tuple[str, ...], side: str) -> None:
    """Print one table of the lab's gaps against every reference given."""
    cells: list[Cell] = []
    for spec in runs:
        name, sep, path = spec.rpartition("=")  # a name may hold "=" (c=1), a path rarely
        if not sep or not name or not path:
            raise click.BadParameter(f"{spec!r}: expected NAME=DIR", param_hint="--run")
        cells += cells_of(name, Path(path), side)
    click.echo(table(cells))


if __name__ == "__main__":
    main()
