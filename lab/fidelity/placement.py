"""Where the target's per-request latency sits: before its scheduler or after the pass
(`lab calibrate`, docs/fidelity.md "Where the request latency sits").

The fit prices the target's path beyond the lab's own as a per-request latency (the linear
model's request terms, a profile's request knots). A one-stream TTFT holds all of it and
cannot say where it is: before the engine's scheduler (the request joins no pass before it
is over) or on the way out (the first token's detokenizing and event, while the engine goes
on). Under load it matters. In a closed loop a request is sent just as another one ends; if
it joins the engine's next pass, the newcomers of a wave are taken in one by one beside the
streams still decoding, and if it misses that pass they wait for the old wave to finish and
then share passes. vLLM at c=8 takes the first way; the lab with the latency before the
scheduler took the second, with TTFTs 30-40% apart (docs/references.md).

The overlap probes show which: their newcomer is sent just after a pass ended, while the
other stream decodes, and the other stream's stall shows when the newcomer's prefill pass
began (`probes.admission_wait_ms`). The lab stack runs the same probes with the fitted
latency placed each way (`request_mode` ``delay`` and ``after``, mocker/engine/config.py);
the placement whose wait comes nearest the target's is kept.
"""

from __future__ import annotations

import copy
import json
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.fidelity import probes as P
from lab.report.markdown import fnum, md_table
from mocker.engine.config import EngineArgs
from mocker.engine.timing import TimingModel

#: the placements compared (mocker/engine/config.py REQUEST_MODES); the first is the fit's own
#: reading and is kept on a tie
PLACEMENTS = ("delay", "after")
#: below this much latency at every overlap length, where it sits moves no request past a
#: pass (a decode step is several ms): no check is run
MIN_LATENCY_MS = 0.5


@dataclass(frozen=True)
class PlacementRow:
    """One overlap probe: the target's admission wait and the lab's under each placement, ms."""

    probe: str
    target_ms: float
    lab_ms: dict[str, float]


@dataclass
class Placement:
    """The placement kept, and the measurements it was chosen on (none when `skipped` says
    why no check ran)."""

    chosen: str = PLACEMENTS[0]
    rows: list[PlacementRow] = field(default_factory=list)
    skipped: str = ""

    def error_ms(self, mode: str) -> float:
        """Mean absolute difference of the lab's admission wait from the target's (ms)."""
        diffs = [abs(r.lab_ms[mode] - r.target_ms) for r in self.rows
                 if math.isfinite(r.lab_ms.get(mode, math.nan))]
        return statistics.fmean(diffs) if diffs else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {"chosen": self.chosen, "skipped": self.skipped,
                "error_ms": {m: self.error_ms(m) for m in PLACEMENTS} if self.rows else {},
                "rows": [r.__dict__ for r in self.rows]}


def placed(args: dict[str, Any], mode: str) -> dict[str, Any]:
    """`args` with its request latency placed as `mode`."""
    out = copy.deepcopy(args)
    out["timing"]["request_mode"] = mode
    return out


def checked_probes(args: dict[str, Any], results: Sequence[P.ProbeResult], budget: int
                   ) -> tuple[list[P.ProbeResult], str]:
    """The target's overlap probes that can show the placement, or none and why not: a
    prompt that fills more than one pass stalls the other stream more than once, and a
    latency too small to move a request past a pass cannot be told apart."""
    mode = args["timing"].get("request_mode", PLACEMENTS[0])
    if mode != PLACEMENTS[0]:
        return [], f"the request latency is read as `{mode}`"
    usable = [r for r in results if r.probe.kind == "overlap" and r.probe.tokens <= budget
              and math.isfinite(r.admission_wait_ms)]
    if not usable:
        return [], "no overlap probe of a prompt that fits one pass saw the other's prefill"
    timing = TimingModel(EngineArgs.from_json({**args, "speedup_ratio": 1.0}))
    if max(timing.request_ms(r.probe.tokens) for r in usable) < MIN_LATENCY_MS:
        return [], (f"the request latency is under {MIN_LATENCY_MS:g} ms at the overlap "
                    "probes' lengths")
    return usable, ""


def choose(target: Sequence[P.ProbeResult], lab: Mapping[str, Sequence[P.ProbeResult]]
           ) -> Placement:
    """The placement whose admission waits come nearest the target's (the first on a tie)."""
    rows = []
    for i, t in enumerate(target):
        rows.append(PlacementRow(t.probe.name, t.admission_wait_ms,
                                 {m: lab[m][i].admission_wait_ms for m in PLACEMENTS}))
    found = Placement(rows=rows)
    errors = [(found.error_ms(m), i) for i, m in enumerate(PLACEMENTS)]
    finite = [(e, i) for e, i in errors if math.isfinite(e)]
    if finite:
        found.chosen = PLACEMENTS[min(finite)[1]]
    return found


async def measure(args: dict[str, Any], target: Sequence[P.ProbeResult], out_dir: Path,
                  tokenizer: str | None, added: bool, workload: Any, client: Any,
                  progress: Any, say: Callable[[str], None]) -> Placement:
    """Run the target's overlap probes on a lab stack with `args` placed each way, one stack
    after the other, into `out_dir/<placement>/`."""
    from lab.fidelity.lab_stack import lab_spec, on_stack

    lab: dict[str, list[P.ProbeResult]] = {}
    for mode in PLACEMENTS:
        spec = lab_spec(engine_args=json.dumps(placed(args, mode)), speedup=1.0,
                        tokenizer=tokenizer, name=f"placement-{mode}")
        spec.add_special_tokens = added
        where = out_dir / mode

        async def work(url: str, model: str, where: Path = where) -> list[P.ProbeResult]:
            return [await P.run_probe(r.probe, url, model, workload, where / r.probe.name,
                                      client, progress) for r in target]

        say(f"request latency placed as `{mode}`: {len(target)} overlap probe(s) on the lab")
        lab[mode] = await on_stack(spec, where / "stack", say, work)
    return choose(target, lab)


def placement_markdown(found: Placement) -> list[str]:
    lines = ["## Where the request latency sits", ""]
    if not found.rows:
        return [*lines, f"`request_mode` {found.chosen}: not checked ({found.skipped}).", ""]
    lines += ["Each overlap probe's newcomer is sent just after a pass ended; the other stream "
              "shows when its prefill pass began (ms after it was sent, the median). The lab "
              "ran the same probes with the fitted request latency before the scheduler "
              "(`delay`) and after the pass (`after`); the nearer is kept: "
              f"`request_mode` **{found.chosen}** (mean difference "
              + ", ".join(f"{m} {fnum(found.error_ms(m), 2)} ms" for m in PLACEMENTS) + ").",
              ""]
    rows = [[r.probe, fnum(r.target_ms, 2), *[fnum(r.lab_ms[m], 2) for m in PLACEMENTS]]
            for r in found.rows]
    return [*lines, md_table(["probe", "target", *[f"lab, {m}" for m in PLACEMENTS]], rows), ""]
