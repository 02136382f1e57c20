"""`lab fidelity --target URL [--engine-args FILE]`: the same sweep against a target and against
the lab's stack, level by level, with a verdict per metric (docs/fidelity.md)."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click

from lab.commands.calibrate import say_to_stderr
from lab.commands.sweep import make_dir
from lab.load.client_settings import ClientSettings
from lab.load.sweep import SweepPlan
from lab.shared.config_cli import field_option
from lab.shared.engine_settings import EngineSettings
from lab.sweep.run_options import TARGET_MODEL_HELP, option_of, run_dir_options
from lab.sweep.sweep_settings import SweepSettings
from lab.sweep.target import prompt_form_options, target_or_exit, workload_from_options
from launch.topology_settings import TopologySettings

DEFAULT_CONC = "1,32,128"
DEFAULT_SPEEDUP = 1.0  # the target runs in real time: so does the lab side
_SEED = field_option(SweepSettings, "seed")
_SPEEDUP = field_option(EngineSettings, "speedup_ratio", ("--speedup",), default=DEFAULT_SPEEDUP,
                        show_default=True, metavar="R", help="Speedup ratio of the lab's engines.")
#: a level's measured requests: rounds of the closed loop, at least a minimum. Fewer than
#: `lab sweep`'s default, as fidelity sweeps every level two or three times (target, lab, ...)
DEFAULT_ROUNDS = 3
DEFAULT_MIN_REQUESTS = 30


@dataclass
class Side:
    """One sweep of the comparison: at `url` (a target) or on a lab stack built from `spec`."""

    name: str
    url: str | None = None
    spec: Any = None

    @property
    def is_lab(self) -> bool:
        return self.spec is not None


@click.command()
@option_of(SweepSettings, "target", required=True,
           help="The OpenAI-compatible server to compare the lab with.")
@click.option("--target-disagg", default=None, metavar="URL",
              help="The same target deployed disaggregated: the lab is swept disaggregated "
              "too (1 prefill + 1 decode engine), and the disaggregation cost (req/s lost vs "
              "aggregated at c=32 and c=128) is put next to the target's.")
@option_of(TopologySettings, "engine_args",
           help="Engine args of the lab's engines, e.g. the engine-args.json of `lab "
           "calibrate`.  [default: the lab mocker's defaults]")
@click.option("--with-defaults", is_flag=True, default=False,
              help="Also sweep the lab with its default engine args (the uncalibrated mocker), "
              "shown beside.")
@click.option(*_SPEEDUP[0], **_SPEEDUP[1])
@option_of(TopologySettings, "model", help=TARGET_MODEL_HELP)
@option_of(TopologySettings, "tokenizer",
           help="The target's tokenizer: prompts of exactly --isl tokens, and the lab's "
           "frontend and engines use it too.")
@prompt_form_options
@option_of(SweepSettings, "conc", default=DEFAULT_CONC, show_default=True,
           help="Concurrency levels, comma-separated.")
@option_of(SweepSettings, "isl", help="Prompt tokens per request.")
@option_of(SweepSettings, "osl", help="Output tokens per request.")
@option_of(SweepSettings, "requests", ("--requests", "n_requests"),
           help="Measured requests per level.  [default: max(--min-requests, --rounds "
           "x concurrency)]")
@click.option("--rounds", type=click.IntRange(1, 1000), default=DEFAULT_ROUNDS,
              show_default=True, help="Without --requests: rounds of the closed loop per level.")
@click.option("--min-requests", type=click.IntRange(1, 10_000_000), default=DEFAULT_MIN_REQUESTS,
              show_default=True, help="Without --requests: the fewest measured requests of a "
              "level.")
@option_of(SweepSettings, "repeat", ("--repeat",), metavar="K", show_default=True,
           help="Sweep every side K times, in turn (target, lab, target, lab, ...; repeat k "
           "sends the prompts of --seed + k - 1, so no prefix cache carries over). The "
           "report then gives each metric's median over the repeats, the gap of the medians "
           "with its 95% bootstrap interval, the median of the per-repeat gaps and the "
           "target's own spread over the repeats (docs/fidelity.md \"Repeats\").")
@option_of(SweepSettings, "warmup",
           help="Warm-up requests per level.  [default: the level's concurrency]")
@click.option(*_SEED[0], **_SEED[1])
@option_of(ClientSettings, "timeout", ("--timeout", "timeout_s"), default=600.0,
           show_default=True, help="Per-request timeout.")
@run_dir_options("fidelity")
def fidelity(**kw: Any) -> None:
    """Sweep --target and the lab's stack (with --engine-args) the same way, and compare.

    Level by level: TTFT p50/mean/p99, ITL p50, latency p50 and req/s of the target and of the lab,
    the gap in % ((lab - target) / target) and a verdict per metric: within 5%, within 10%, or
    off. The target is swept first, then the lab stack is launched, swept and torn down. A
    target that keeps a prefix cache should be fresh (the same seed sends the same prompts).
    One sweep of a closed loop can land in either of two modes at a level: --repeat K gives
    the gaps over K sweeps of each side.

    Writes RUN/: target/ and lab/ (and lab-defaults/, target-disagg/, lab-disagg/), each a
    `lab sweep` run directory, or with --repeat repeat-1/ ... repeat-K/ holding them;
    fidelity.md, fidelity.json, plots/fidelity.png and (without --repeat) compare/, the `lab
    compare` overlays.
    """
    from lab.fidelity.lab_stack import lab_spec

    concs = tuple(kw["conc"])
    workload = workload_from_options(kw, target=kw["target"])
    lab_kw = {"speedup": kw["speedup"], "tokenizer": kw["tokenizer"]}
    sides = [Side("target", url=kw["target"]),
             Side("lab", spec=lab_spec(engine_args=kw["engine_args"], name="lab", **lab_kw))]
    if kw["with_defaults"]:
        sides.append(Side("lab-defaults", spec=lab_spec(name="lab-defaults", **lab_kw)))
    if kw["target_disagg"]:
        sides += [Side("target-disagg", url=kw["target_disagg"]),
                  Side("lab-disagg", spec=lab_spec(engine_args=kw["engine_args"], disagg=True,
                                                   name="lab-disagg", **lab_kw))]
    checks = {}
    for side in sides:
        if side.url is not None:
            option = "--target" if side.name == "target" else "--target-disagg"
            try:
                info = target_or_exit(side.url, kw["model"], workload, kw["timeout_s"],
                                      quiet=kw["quiet"])
            except click.BadParameter as exc:
                if exc.param_hint == "'--target'":
                    exc.param_hint = f"'{option}'"
                raise
            side.url = info.url
            checks[side.name] = info
    info = checks["target"]
    workload = replace(workload, include_usage=info.include_usage)
    run_dir = make_dir(kw["name"], kw["out"])
    from launch.config import write_config

    write_config(run_dir, extra={"fidelity": {
        "target": info.url, "target_disagg": kw["target_disagg"], "model": info.model,
        "engine_args": kw["engine_args"], "speedup": kw["speedup"], "concurrency": list(concs),
        "workload": workload.to_dict(), "requests": kw["n_requests"], "warmup": kw["warmup"],
        "repeat": kw["repeat"], "argv": sys.argv}})
    sys.exit(run_fidelity(run_dir, sides, concs, workload, info.model, kw))


@dataclass
class RoundsPlan(SweepPlan):
    """A sweep plan whose levels default to `rounds` rounds of the closed loop."""

    rounds: int = DEFAULT_ROUNDS
    min_requests: int = DEFAULT_MIN_REQUESTS

    def requests_for(self, c: int) -> int:
        if self.requests is not None:
            return self.requests
        return max(self.min_requests, self.rounds * c)


def run_fidelity(run_dir: Path, sides: list[Side], concs: tuple[int, ...], workload: Any,
                 model: str, kw: dict) -> int:
    import uvloop

    from lab.load.client import ClientOptions
    from lab.load.sweep import LevelFailed, LineProgress
    from launch.errors import LaunchError

    say = say_to_stderr(kw["quiet"])
    repeat = kw["repeat"]
    progress = LineProgress(quiet=kw["quiet"])
    for k in range(1, repeat + 1):
        plan = RoundsPlan(concurrency=list(concs),
                          workload=replace(workload, seed=workload.seed + k - 1),
                          requests=kw["n_requests"], warmup=kw["warmup"],
                          client=ClientOptions(timeout_s=kw["timeout_s"],
                                               isolate=not kw["in_process_client"]),
                          rounds=kw["rounds"], min_requests=kw["min_requests"])
        repeat_dir = run_dir if repeat == 1 else run_dir / f"repeat-{k}"
        repeat_of = "" if repeat == 1 else f"repeat {k}/{repeat}, "
        for i, side in enumerate(sides, start=1):
            say(f"{repeat_of}side {i}/{len(sides)}: {side.name}")
            try:
                uvloop.run(_sweep_side(repeat_dir / side.name, side, plan, model, progress,
                                       say))
            except LevelFailed as exc:
                click.echo(f"error: {repeat_of}{side.name}: {exc}", err=True)
                return 1
            except LaunchError as exc:
                click.echo(f"error: the lab stack ({repeat_of}{side.name}) did not start: "
                           f"{exc.message()}", err=True)
                return 1
            except KeyboardInterrupt:
                click.echo("\ninterrupted: the completed sweeps are kept", err=True)
                return 130
            except (RuntimeError, OSError) as exc:
                click.echo(f"error: {repeat_of}{side.name}: {exc}", err=True)
                return 1
    text = report(run_dir, sides, workload, kw) if repeat == 1 else \
        report_repeats(run_dir, sides, workload, kw)
    click.echo(text)
    return 0


async def _sweep_side(out: Path, side: Side, plan: Any, model: str, progress: Any,
                      say: Any) -> None:
    from lab.fidelity.lab_stack import on_stack
    from lab.load.sweep import SweepRunner
    from launch.config import write_config

    out.mkdir(parents=True)
    sweep_cfg = {"sweep": {"name": side.name, "target": side.url, **plan.to_dict()}}
    if not side.is_lab:
        assert side.url is not None  # a target side has its URL
        write_config(out, extra={"sweep": {**sweep_cfg["sweep"], "model": model}})
        await SweepRunner(out, side.url, model, plan, progress=progress).run()
        return
    write_config(out, side.spec, extra=sweep_cfg)

    async def work(url: str, lab_model: str) -> None:
        await SweepRunner(out, url, lab_model, plan, progress=progress).run()

    await on_stack(side.spec, out, say, work)


def report(run_dir: Path, sides: list[Side], workload: Any, kw: dict) -> str:
    """fidelity.md / fidelity.json / plots; returns the markdown."""
    from lab.fidelity.gaps import Gap, disagg_cost, level_gaps
    from lab.report.comparison import compare_runs, load_run
    from lab.report.markdown import fnum, md_table

    runs = {s.name: load_run(run_dir / s.name) for s in sides}
    target = runs["target"].levels
    gaps = {name: level_gaps(target, runs[name].levels)
            for name in ("lab", "lab-defaults") if name in runs}
    lines = _intro(workload, kw)
    header = ["conc", "metric", "target", "lab", "gap", "verdict"]
    if "lab-defaults" in gaps:
        header += ["lab defaults", "gap", "verdict"]
    rows = []
    for i, g in enumerate(gaps["lab"]):
        row = [str(g.concurrency), g.label, fnum(g.target, 2), fnum(g.lab, 2),
               _pct(g.gap_pct), g.verdict]
        if "lab-defaults" in gaps:
            d = gaps["lab-defaults"][i]
            row += [fnum(d.lab, 2), _pct(d.gap_pct), d.verdict]
        rows.append(row)
    lines += [md_table(header, rows), ""]
    costs: dict[str, dict[int, float]] = {}
    dgaps: list[Gap] = []
    if "target-disagg" in runs and "lab-disagg" in runs:
        costs = {"target": disagg_cost(target, runs["target-disagg"].levels),
                 "lab": disagg_cost(runs["lab"].levels, runs["lab-disagg"].levels)}
        lines += _cost_section(costs, "## Disaggregation cost (req/s lost vs aggregated)")
        dgaps = level_gaps(runs["target-disagg"].levels, runs["lab-disagg"].levels)
        lines += ["## Disaggregated, level by level", "",
                  md_table(["conc", "metric", "target", "lab", "gap", "verdict"],
                           [[str(g.concurrency), g.label, fnum(g.target, 2), fnum(g.lab, 2),
                             _pct(g.gap_pct), g.verdict] for g in dgaps]), ""]
    if not kw["no_plots"]:
        from lab.fidelity.plots import fidelity_plot

        plot = fidelity_plot([(n, r.levels) for n, r in runs.items()],
                             run_dir / "plots" / "fidelity.png",
                             f"ISL {workload.isl} / OSL {workload.osl}")
        lines += [f"![fidelity]({plot.relative_to(run_dir)})", ""]
    compare_runs([run_dir / s.name for s in sides], run_dir / "compare",
                 make_plots=not kw["no_plots"])
    lines += [f"Run directory: {run_dir} (overlay plots in compare/).", ""]
    text = "\n".join(lines)
    (run_dir / "fidelity.md").write_text(text)
    (run_dir / "fidelity.json").write_text(json.dumps(
        {"gaps": {k: [g.to_dict() for g in v] for k, v in gaps.items()},
         "disagg_gaps": [g.to_dict() for g in dgaps],
         "disagg_cost_pct": {k: {str(c): v for c, v in d.items()} for k, d in costs.items()}},
        indent=2, default=str) + "\n")
    return text


def _cost_section(costs: dict[str, dict[int, float]], title: str) -> list[str]:
    """The disaggregation cost of target and lab, side by side, under `title`."""
    from lab.report.markdown import md_table

    rows = [[str(c), _pct(costs["target"].get(c, math.nan)), _pct(costs["lab"].get(c, math.nan))]
            for c in sorted(set(costs["target"]) | set(costs["lab"]))]
    return [title, "", md_table(["conc", "target", "lab"], rows) if rows else
            "No level at c=32 or c=128 in both sweeps.", ""]


def _intro(workload: Any, kw: dict) -> list[str]:
    return [f"# Fidelity: the lab against {kw['target']}", "",
            f"Workload: ISL {workload.isl}, OSL {workload.osl}, {workload.endpoint}, "
            f"{workload.prompt_kind} prompts; lab engine args: "
            f"{kw['engine_args'] or 'defaults'}, speedup {kw['speedup']:g}. Gap = (lab - "
            "target) / target.", ""]


#: (lab side, the side it is compared with, the section's title) of a report over repeats
_REPEAT_PAIRS = (("lab", "target", "The lab against the target"),
                ("lab-defaults", "target", "The lab with its default engine args"),
                ("lab-disagg", "target-disagg", "Disaggregated, level by level"))


def report_repeats(run_dir: Path, sides: list[Side], workload: Any, kw: dict) -> str:
    """fidelity.md / fidelity.json / plots over `--repeat` sweeps (lab/fidelity/repeats.py);
    returns the markdown."""
    from lab.fidelity.gaps import disagg_cost
    from lab.fidelity.repeats import median_levels, repeat_gaps
    from lab.report.comparison import load_run
    from lab.report.markdown import fnum, md_table

    repeat = kw["repeat"]
    repeats = {s.name: [load_run(run_dir / f"repeat-{k}" / s.name).levels
                       for k in range(1, repeat + 1)] for s in sides}
    lines = [
        *_intro(workload, kw),
        f"Over {repeat} repeats (repeat-1/ ... repeat-{repeat}/, each side swept in turn): "
        "the target and lab columns are medians over the repeats, the gap is theirs, with "
        "its 95% bootstrap interval (repeats resampled in pairs), and the median of the "
        "per-repeat gaps beside it; the verdict is on the gap. The target's spread is its own "
        "range over the repeats (max - min, % of its median): one sweep does not resolve a "
        "gap smaller than that.", ""]
    header = ["conc", "metric", "target", "lab", "gap", "95% interval", "per-repeat gap",
              "target's spread", "verdict"]
    gaps = {}
    for lab, target, title in _REPEAT_PAIRS:
        if lab not in repeats or target not in repeats:
            continue
        gaps[lab] = repeat_gaps(repeats[target], repeats[lab])
        rows = [[str(g.concurrency), g.label, fnum(g.target, 2), fnum(g.lab, 2),
                 _pct(g.gap_pct), f"{_pct(g.low_pct)} .. {_pct(g.high_pct)}",
                 _pct(g.repeat_gap_pct), _spread(g.target_spread_pct), g.verdict]
                for g in gaps[lab]]
        lines += [f"## {title}", "", md_table(header, rows), ""]
    medians = {name: median_levels(r) for name, r in repeats.items()}
    costs: dict[str, dict[int, float]] = {}
    if "target-disagg" in medians and "lab-disagg" in medians:
        costs = {"target": disagg_cost(medians["target"], medians["target-disagg"]),
                 "lab": disagg_cost(medians["lab"], medians["lab-disagg"])}
        lines += _cost_section(
            costs, "## Disaggregation cost (req/s lost vs aggregated, of the medians)")
    if not kw["no_plots"]:
        from lab.fidelity.plots import fidelity_plot

        plot = fidelity_plot(list(medians.items()), run_dir / "plots" / "fidelity.png",
                             f"ISL {workload.isl} / OSL {workload.osl}, medians of "
                             f"{repeat} repeats")
        lines += [f"![fidelity]({plot.relative_to(run_dir)})", ""]
    lines += [f"Run directory: {run_dir} (`lab compare` overlays any repeat's sides).", ""]
    text = "\n".join(lines)
    (run_dir / "fidelity.md").write_text(text)
    (run_dir / "fidelity.json").write_text(json.dumps(
        {"repeat": repeat,
         "gaps": {k: [g.to_dict() for g in v] for k, v in gaps.items() if k != "lab-disagg"},
         "disagg_gaps": [g.to_dict() for g in gaps.get("lab-disagg", [])],
         "disagg_cost_pct": {k: {str(c): v for c, v in d.items()} for k, d in costs.items()}},
        indent=2, default=str) + "\n")
    return text


def _pct(v: float) -> str:
    return "-" if not math.isfinite(v) else f"{v:+.1f}%"


def _spread(v: float) -> str:
    return "-" if not math.isfinite(v) else f"{v:.1f}%"
