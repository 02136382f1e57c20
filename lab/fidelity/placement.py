"""Where the target's per-request latency sits: before its scheduler or after the request's
first pass (`lab calibrate`, docs/fidelity.md "Where the request latency sits").

The fit prices the target's path beyond the lab's own as a per-request latency (the linear
model's request terms, a profile's request knots). A one-stream TTFT holds all of it and
cannot say where it is: before the engine's scheduler (the request joins no pass before it
is over) or after the first pass (the first token's way out, while the engine goes on).
Under load it matters. In a closed loop a request is sent just as another one ends; if it
joins the engine's next pass, the newcomers of a wave are taken in one by one beside the
streams still decoding, and if it misses that pass they wait for the old wave to finish and
then share passes. vLLM at c=8 takes the first way; the lab with all of vLLM's latency before
the scheduler took the second, with TTFTs 30-40% apart (docs/references.md).

The overlap probes show it: their newcomer is sent just after a pass ended, while the other
stream decodes, and the other stream's stall shows when the newcomer's prefill pass began
(`probes.admission_wait_ms`). The lab stack runs the same probes with all of the fitted
latency before the scheduler and with all of it after the first pass
(`request_after_share` 0 and 1, mocker/engine/config.py); per probe, the share that puts the
lab's wait on the target's, by linear interpolation between the two, and their median is
kept. A third lab stack runs the probes again at that share, for the report.
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
from mocker.engine.config import REQUEST_AFTER_SHARE, EngineArgs
from mocker.engine.timing import TimingModel

#: below this much latency at every overlap length, where it sits moves no request past a
#: pass (a decode step is several ms): no check is run
MIN_LATENCY_MS = 0.5
#: a probe whose waits with all of the latency before and all after differ by less than this
#: cannot place it (the latency moved no newcomer past a pass there)
MIN_SPREAD_MS = 0.5
#: the lab runs of the check: all before the scheduler, all after the first pass
ENDS = (0.0, 1.0)


@dataclass(frozen=True)
class PlacementRow:
    """One overlap probe: the target's admission wait and the lab's at each after-share run
    (keyed by the share), ms."""

    probe: str
    target_ms: float
    lab_ms: dict[float, float]

    def share(self) -> float:
        """The after-share that puts the lab's wait on the target's (linear between the two
        ends, clamped to 0..1); NaN when the ends do not differ."""
        before, after = self.lab_ms.get(0.0, math.nan), self.lab_ms.get(1.0, math.nan)
        if not before - after >= MIN_SPREAD_MS or not math.isfinite(self.target_ms):
            return math.nan
        return min(max((before - self.target_ms) / (before - after), 0.0), 1.0)


@dataclass
class Placement:
    """The after-share kept, and the measurements it was chosen on (none when `skipped` says
    why no check ran)."""

    share: float = 0.0
    rows: list[PlacementRow] = field(default_factory=list)
    skipped: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"share": self.share, "skipped": self.skipped,
                "rows": [{"probe": r.probe, "target_ms": r.target_ms, "share": r.share(),
                          "lab_ms": {f"{k:g}": v for k, v in r.lab_ms.items()}}
                         for r in self.rows]}


def placed(args: dict[str, Any], share: float) -> dict[str, Any]:
    """`args` with `share` of its request latency after the first pass (no key for 0)."""
    out = copy.deepcopy(args)
    out["timing"].pop(REQUEST_AFTER_SHARE, None)
    if share > 0.0:
        out["timing"][REQUEST_AFTER_SHARE] = share
    return out


def checked_probes(args: dict[str, Any], results: Sequence[P.ProbeResult], budget: int
                   ) -> tuple[list[P.ProbeResult], str]:
    """The target's overlap probes that can show the placement, or none and why not: a
    prompt that fills more than one pass stalls the other stream more than once, and a
    latency too small to move a request past a pass cannot be told apart."""
    mode = args["timing"].get("request_mode", "delay")
    if mode != "delay":
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


def choose(target: Sequence[P.ProbeResult], lab: Mapping[float, Sequence[P.ProbeResult]]
           ) -> Placement:
    """The median over the probes of each one's share (`PlacementRow.share`), to 0.01; 0 when
    no probe can place it."""
    rows = [PlacementRow(t.probe.name, t.admission_wait_ms,
                         {s: lab[s][i].admission_wait_ms for s in ENDS})
            for i, t in enumerate(target)]
    shares = [s for s in (r.share() for r in rows) if math.isfinite(s)]
    return Placement(share=round(statistics.median(shares), 2) if shares else 0.0, rows=rows)


async def measure(args: dict[str, Any], target: Sequence[P.ProbeResult], out_dir: Path,
                  tokenizer: str | None, added: bool, workload: Any, client: Any,
                  progress: Any, say: Callable[[str], None]) -> Placement:
    """Run the target's overlap probes on a lab stack at each end (`ENDS`), one stack after
    the other, choose the share, and run them once more at it (unless it is an end), into
    `out_dir/share-<share>/`."""
    from lab.fidelity.lab_stack import lab_spec, on_stack

    async def run_at(share: float) -> list[P.ProbeResult]:
        spec = lab_spec(engine_args=json.dumps(placed(args, share)), speedup=1.0,
                        tokenizer=tokenizer, name=f"placement-{share:g}")
        spec.add_special_tokens = added
        where = out_dir / f"share-{share:g}"

        async def work(url: str, model: str) -> list[P.ProbeResult]:
            return [await P.run_probe(r.probe, url, model, workload, where / r.probe.name,
                                      client, progress) for r in target]

        say(f"request latency {100 * share:.0f}% after the first pass: {len(target)} overlap "
            "probe(s) on the lab")
        return await on_stack(spec, where / "stack", say, work)

    lab = {share: await run_at(share) for share in ENDS}
    found = choose(target, lab)
    if found.share not in ENDS:
        check = await run_at(found.share)
        found.rows = [PlacementRow(r.probe, r.target_ms,
                                   {**r.lab_ms, found.share: c.admission_wait_ms})
                      for r, c in zip(found.rows, check, strict=True)]
    return found


def placement_markdown(found: Placement) -> list[str]:
    lines = ["## Where the request latency sits", ""]
    if not found.rows:
        return [*lines, f"`{REQUEST_AFTER_SHARE}` {found.share:g}: not measured "
                f"({found.skipped}).", ""]
    lines += ["Each overlap probe's newcomer is sent just after a pass ended; the other stream "
              "shows when its prefill pass began (ms after it was sent, the median). The lab "
              "ran the same probes with the fitted request latency all before the scheduler "
              "(after-share 0) and all after the first pass (1); per probe, the share that "
              "puts the lab's wait on the target's (linear between the two), and their "
              f"median is kept: `{REQUEST_AFTER_SHARE}` **{found.share:g}**.", ""]
    runs = sorted({s for r in found.rows for s in r.lab_ms})
    rows = [[r.probe, fnum(r.target_ms, 2), *[fnum(r.lab_ms.get(s, math.nan), 2) for s in runs],
             fnum(r.share(), 2)] for r in found.rows]
    return [*lines, md_table(["probe", "target", *[f"lab, share {s:g}" for s in runs],
                              "share"], rows), ""]
