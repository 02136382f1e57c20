"""`lab fidelity --suite`: a fixed set of held-out workloads, none of them a shape `lab calibrate`
fits on, swept on the target and on every lab side, and one table of their gaps.

The workloads (docs/fidelity.md "`lab fidelity`"):

* `isl512-osl64`: ISL 512 / OSL 64, closed loop at c=1, 8, 32;
* `isl2048-osl32`: ISL 2048 / OSL 32, closed loop at c=1, 8, 32;
* `poisson-near-sat`: ISL 136 / OSL 128, Poisson arrivals at 0.5, 0.8 and 1.0 x the target's
  saturation;
* `prefix-trace`: a synthesised trace (`lab trace synth`'s generator) of ISL 512 / OSL 64
  whose prompts start with one of 4 shared prefixes of 256 tokens (half of each prompt), Poisson
  arrivals at 0.5 x the target's saturation.

The saturation is measured on the target first: the achieved req/s of a closed-loop level at
c=64, ISL 136 / OSL 128. The counts are sized so that a p50 is not a draw of a few requests and
a p99 not the largest of a few dozen (docs/fidelity.md "The held-out suite"); `--requests N`
sets every level's (and the trace's) count.

The report: rows are metric x workload level; columns the target's value, each lab side's
value and gap, and the target's own spread over `--repeat` repeats; then per lab side and
metric the mean absolute gap over every level and the share of gaps within 5/10/15%.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from lab.fidelity.gaps import METRICS, Gap, level_gaps
from lab.load.trace_synth import SynthSpec

SATURATION_CONC = 64
SATURATION_ISL = 136
SATURATION_OSL = 128
#: the saturation level's measured requests without --requests (two rounds of the loop)
SATURATION_REQUESTS = 2 * SATURATION_CONC
#: a closed-loop level's measured requests without --requests: max(MIN, ROUNDS x c). At 8
#: requests (c=1) or 16 (c=8) a closed loop's p50 was a draw: ISL 2048 at c=8 settles into one
#: of two rotations, and 16 requests held one or the other (docs/references.md)
CLOSED_ROUNDS = 2
CLOSED_MIN_REQUESTS = 32
#: an open-loop level's measured requests without --requests: this many seconds of arrivals
#: at the saturation rate (one count for the entry's every rate), at least OPEN_MIN_REQUESTS
OPEN_SECONDS = 15.0
OPEN_MIN_REQUESTS = 20
#: the prefix-reuse trace: requests, shape and reuse
TRACE_REQUESTS = 240
TRACE_BLOCK_SIZE = 64
TRACE_PREFIX_GROUPS = 4
TRACE_PREFIX_BLOCKS = 4
#: the bands of the summary's "share of gaps within" columns, in %
BANDS = (5.0, 10.0, 15.0)


@dataclass(frozen=True)
class SuiteEntry:
    """One held-out workload: closed-loop levels (`conc`), open-loop rates as fractions of the
    target's saturation (`fractions`), or a prefix-reuse trace at `trace_fraction` of it."""

    name: str
    isl: int
    osl: int
    conc: tuple[int, ...] = ()
    fractions: tuple[float, ...] = ()
    trace_fraction: float | None = None

    def describe(self, saturation: float | None = None) -> str:
        shape = f"ISL {self.isl} / OSL {self.osl}"
        if self.conc:
            return f"{shape}, closed loop at c={','.join(str(c) for c in self.conc)}"
        if self.fractions:
            rates = ", ".join(f"{f:g}" for f in self.fractions)
            at = "" if saturation is None else \
                f" = {', '.join(f'{r:.2f}' for r in self.rates(saturation))} req/s"
            return f"{shape}, Poisson at {rates} x saturation{at}"
        assert self.trace_fraction is not None
        rate = "" if saturation is None else f" = {self.trace_fraction * saturation:.2f} req/s"
        return (f"{shape}, prefix-reuse trace ({TRACE_PREFIX_GROUPS} shared prefixes of "
                f"{TRACE_PREFIX_BLOCKS * TRACE_BLOCK_SIZE} tokens), Poisson at "
                f"{self.trace_fraction:g} x saturation{rate}")

    def rates(self, saturation: float) -> list[float]:
        return [round(f * saturation, 3) for f in self.fractions]

    @property
    def is_trace(self) -> bool:
        return self.trace_fraction is not None


SUITE: tuple[SuiteEntry, ...] = (
    SuiteEntry("isl512-osl64", 512, 64, conc=(1, 8, 32)),
    SuiteEntry("isl2048-osl32", 2048, 32, conc=(1, 8, 32)),
    SuiteEntry("poisson-near-sat", SATURATION_ISL, SATURATION_OSL, fractions=(0.5, 0.8, 1.0)),
    SuiteEntry("prefix-trace", 512, 64, trace_fraction=0.5),
)


def open_requests(saturation: float, requests: int | None) -> int:
    """An open-loop level's measured requests: --requests, else OPEN_SECONDS at saturation."""
    if requests is not None:
        return requests
    return max(OPEN_MIN_REQUESTS, round(OPEN_SECONDS * saturation))


def trace_spec(entry: SuiteEntry, saturation: float, requests: int | None,
               seed: int) -> SynthSpec:
    """The prefix-reuse trace of `entry` (TRACE_REQUESTS, or --requests, requests)."""
    assert entry.trace_fraction is not None
    return SynthSpec(requests=requests or TRACE_REQUESTS,
                     rate=entry.trace_fraction * saturation, isl=entry.isl, osl=entry.osl,
                     prefix_groups=TRACE_PREFIX_GROUPS, prefix_blocks=TRACE_PREFIX_BLOCKS,
                     block_size=TRACE_BLOCK_SIZE, seed=seed)


# ----- the report -----

@dataclass(frozen=True)
class SuiteRow:
    """One metric at one workload level: the target's value, each lab side's value and gap,
    and the target's spread over the repeats (NaN with one)."""

    metric: str
    label: str
    entry: str
    level: str
    target: float
    sides: dict[str, tuple[float, float]]  # side -> (value, gap %)
    target_spread_pct: float

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "label": self.label, "workload": self.entry,
                "level": self.level, "target": self.target,
                "sides": {k: {"lab": v, "gap_pct": g} for k, (v, g) in self.sides.items()},
                "target_spread_pct": self.target_spread_pct}


def suite_rows(gaps: dict[str, dict[str, list[Gap]]], entries: list[SuiteEntry]
               ) -> list[SuiteRow]:
    """`gaps[entry][side]`: that entry's gaps (level_gaps or repeat_gaps) of each lab side,
    into rows grouped by metric, then workload, then level."""
    rows = []
    for metric, label in METRICS:
        for entry in entries:
            by_side = gaps.get(entry.name, {})
            if not by_side:
                continue
            first = next(iter(by_side.values()))
            for g in (g for g in first if g.metric == metric):
                sides = {}
                for side, side_gaps in by_side.items():
                    same = next((x for x in side_gaps
                                 if x.metric == metric and x.level == g.level), None)
                    sides[side] = (math.nan, math.nan) if same is None else (same.lab,
                                                                              same.gap_pct)
                rows.append(SuiteRow(metric, label, entry.name, g.level, g.target, sides,
                                     getattr(g, "target_spread_pct", math.nan)))
    return rows


def summary(rows: list[SuiteRow], sides: list[str]) -> dict[str, dict[str, dict[str, float]]]:
    """Per lab side, per metric (and 'all'): the mean absolute gap over the levels that have
    one, their count, the share of them within each of BANDS (%), and the share within the
    target's own spread over the repeats (`within_spread_pct`, of the levels that have a
    spread: a gap no larger than the target's run-to-run range is not one the suite resolves;
    NaN with one repeat)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for side in sides:
        per: dict[str, dict[str, float]] = {}
        for metric, _ in (*METRICS, ("all", "all")):
            gaps = [abs(r.sides[side][1]) for r in rows
                    if side in r.sides and (metric == "all" or r.metric == metric)
                    and math.isfinite(r.sides[side][1])]
            stats: dict[str, float] = {"levels": len(gaps),
                                       "mean_abs_gap_pct": sum(gaps) / len(gaps)
                                       if gaps else math.nan}
            for band in BANDS:
                stats[f"within_{band:g}_pct"] = (100.0 * sum(g <= band for g in gaps)
                                                 / len(gaps)) if gaps else math.nan
            spread = [abs(r.sides[side][1]) <= r.target_spread_pct for r in rows
                      if side in r.sides and (metric == "all" or r.metric == metric)
                      and math.isfinite(r.sides[side][1]) and math.isfinite(r.target_spread_pct)]
            stats["within_spread_pct"] = (100.0 * sum(spread) / len(spread)) if spread \
                else math.nan
            per[metric] = stats
        out[side] = per
    return out


def _pct(v: float) -> str:
    return "-" if not math.isfinite(v) else f"{v:+.1f}%"


def _num(v: float) -> str:
    return "-" if not math.isfinite(v) else f"{v:,.2f}"


def _share(v: float) -> str:
    return "-" if not math.isfinite(v) else f"{v:.0f}%"


def suite_markdown(rows: list[SuiteRow], sides: list[tuple[str, str]],
                   stats: dict[str, dict[str, dict[str, float]]], intro: list[str]) -> str:
    """The one table (and the summary under it); `sides`: (side, its column title)."""
    from lab.report.markdown import md_table

    header = ["metric", "workload", "level", "target"]
    for _, title in sides:
        header += [title, "gap"]
    header.append("target's spread")
    body = []
    for r in rows:
        line = [r.label, r.entry, r.level, _num(r.target)]
        for side, _ in sides:
            value, gap = r.sides.get(side, (math.nan, math.nan))
            line += [_num(value), _pct(gap)]
        line.append("-" if not math.isfinite(r.target_spread_pct)
                    else f"{r.target_spread_pct:.1f}%")
        body.append(line)
    labels = dict(METRICS) | {"all": "all metrics"}
    summary_rows = []
    for side, title in sides:
        for metric, s in stats[side].items():
            summary_rows.append([title, labels[metric], str(int(s["levels"])),
                                 "-" if not math.isfinite(s["mean_abs_gap_pct"])
                                 else f"{s['mean_abs_gap_pct']:.1f}%",
                                 *[_share(s[f"within_{b:g}_pct"]) for b in BANDS],
                                 _share(s["within_spread_pct"])])
    lines = [*intro, md_table(header, body), "", "## Mean absolute gap over the levels", "",
             md_table(["lab side", "metric", "levels", "mean |gap|",
                       *[f"within {b:g}%" for b in BANDS], "within the target's spread"],
                      summary_rows), ""]
    return "\n".join(lines)


def write_suite(run_dir: Path, text: str, doc: dict[str, Any]) -> None:
    (run_dir / "suite.md").write_text(text)
    (run_dir / "suite.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")


def entry_gaps(target: list[pd.DataFrame], lab: list[pd.DataFrame],
               trace: bool) -> list[Gap]:
    """One entry's gaps of one lab side: over the repeats when there are two or more."""
    if len(target) == 1:
        return level_gaps(target[0], lab[0], trace=trace)
    from lab.fidelity.repeats import repeat_gaps

    return list(repeat_gaps(target, lab, trace=trace))
