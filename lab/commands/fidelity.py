"""`lab fidelity --target URL [--engine-args FILE]`: the same sweep against a target and against
the lab's stack, level by level, with a verdict per metric (docs/fidelity.md)."""

from __future__ import annotations

import asyncio
import json
import math
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from lab.commands.calibrate import say_to_stderr
from lab.commands.sweep import _given, _main_task_guard, make_dir
from lab.load.client_settings import ClientSettings
from lab.load.sweep import SweepPlan
from lab.load.trace_settings import TraceSettings
from lab.open_loop.arrival_settings import ArrivalSettings
from lab.shared.config_cli import field_option, options
from lab.shared.engine_settings import EngineSettings
from lab.sweep.run_options import TARGET_MODEL_HELP, option_of, run_client, run_dir_options
from lab.sweep.sweep_settings import SweepSettings
from lab.sweep.target import prompt_form_options, target_or_exit, workload_from_options
from launch.topology_settings import TopologySettings

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_CONC = "1,32,128"
DEFAULT_SPEEDUP = 1.0  # the target runs in real time: so does the lab side
_SEED = field_option(SweepSettings, "seed")
_SPEEDUP = field_option(EngineSettings, "speedup_ratio", ("--speedup",), default=DEFAULT_SPEEDUP,
                        show_default=True, metavar="R", help="Speedup ratio of the lab's engines.")
#: a level's measured requests: rounds of the closed loop, at least a minimum. Fewer than
#: `lab sweep`'s default, as fidelity sweeps every level two or three times (target, lab, ...)
DEFAULT_ROUNDS = 3
DEFAULT_MIN_REQUESTS = 30
#: the side names `--also-engine-args NAME=FILE` may not take
_RESERVED = {"target", "lab", "lab-defaults", "target-disagg", "lab-disagg", "saturation"}
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
#: options the suite sets itself (its workloads): refused beside --suite
_SUITE_SETS = ("conc", "isl", "osl", "target_disagg", "rounds", "min_requests")


@dataclass
class Side:
    """One sweep of the comparison: at `url` (a target) or on a lab stack built from `spec`."""

    name: str
    url: str | None = None
    spec: Any = None
    title: str = ""  # its column in the report (default: the name)
    engine_args: str | None = None
    server_pids: dict[str, int] = field(default_factory=dict)  # a target's --server-pid

    @property
    def is_lab(self) -> bool:
        return self.spec is not None

    @property
    def column(self) -> str:
        return self.title or self.name


def parse_also(values: tuple[str, ...]) -> list[tuple[str, str]]:
    """--also-engine-args NAME=FILE pairs; a usage error naming the option otherwise."""
    out: list[tuple[str, str]] = []
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not path or not _NAME_RE.match(name):
            raise click.BadParameter(f"{value!r}: expected NAME=FILE, e.g. linear-fit=engine-"
                                     "args.json (NAME: letters, digits, . _ -)",
                                     param_hint="'--also-engine-args'")
        if name in _RESERVED or name in dict(out):
            raise click.BadParameter(f"{value!r}: the name {name!r} is taken (reserved: "
                                     f"{', '.join(sorted(_RESERVED))}; each NAME once)",
                                     param_hint="'--also-engine-args'")
        if not Path(path).is_file():
            raise click.BadParameter(f"{value!r}: no file {path}",
                                     param_hint="'--also-engine-args'")
        out.append((name, path))
    return out


@click.command()
@option_of(SweepSettings, "target", required=True,
           help="The OpenAI-compatible server to compare the lab with.")
@option_of(SweepSettings, "server_pids",
           help="Sample this process of the target (and its children) in every sweep of the "
           "target: its CPU and its CPU wait (time runnable, waiting for a core), per level, "
           "in each sweep's report, and the levels where it waited in fidelity.md / suite.md; "
           "e.g. --server-pid engine=1240 (repeatable).")
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
@click.option("--also-engine-args", "also", multiple=True, metavar="NAME=FILE",
              help="Also sweep the lab with these engine args, shown beside as NAME "
              "(repeatable), e.g. --also-engine-args linear-fit=linear/engine-args.json.")
@click.option("--suite", is_flag=True, default=False,
              help="Sweep the held-out suite instead of one shape: ISL 512/OSL 64 and ISL "
              "2048/OSL 32 at c=1,8,32, Poisson at 0.5/0.8/1.0 x the target's saturation "
              "(its req/s at c=64, ISL 136/OSL 128, measured first) and a prefix-reuse trace; "
              "one table of every level's gaps and each lab side's mean absolute gap "
              "(docs/fidelity.md). --requests sets every level's count.")
@click.option(*_SPEEDUP[0], **_SPEEDUP[1])
@option_of(TopologySettings, "model", help=TARGET_MODEL_HELP)
@option_of(TopologySettings, "tokenizer",
           help="The target's tokenizer: prompts of exactly --isl tokens, and the lab's "
           "frontend and engines use it too.")
@prompt_form_options
@option_of(SweepSettings, "conc", default=DEFAULT_CONC, show_default=True,
           help="Concurrency levels, comma-separated.")
@options(ArrivalSettings, param="arrival")
@options(TraceSettings, param="trace")
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

    Levels are --conc concurrencies (closed loop), --rate rates (open loop; `auto`: the
    target's saturation search, whose rates the lab is then swept at) or one --trace replay;
    they line up by concurrency or offered rate, as in `lab compare`. --suite sweeps the
    held-out workloads instead and prints one table.

    Writes RUN/: target/ and lab/ (and lab-defaults/, NAME/ of --also-engine-args,
    target-disagg/, lab-disagg/), each a `lab sweep` run directory, or with --repeat repeat-1/
    ... repeat-K/ holding them; fidelity.md, fidelity.json, plots/fidelity.png and (without
    --repeat) compare/, the `lab compare` overlays. With --suite: saturation/, then
    [repeat-k/]WORKLOAD/SIDE/ run directories, suite.md and suite.json.
    """
    from lab.fidelity.lab_stack import lab_spec
    from lab.fidelity.target_engine import added_prompt_tokens

    arrival: ArrivalSettings = kw.pop("arrival")
    trace: TraceSettings = kw.pop("trace")
    _check_shape(kw, arrival, trace)
    also = parse_also(kw["also"])
    concs = tuple(kw["conc"])
    workload = workload_from_options(kw, target=kw["target"])
    lab_kw = {"speedup": kw["speedup"], "tokenizer": kw["tokenizer"]}
    sides = [Side("target", url=kw["target"], server_pids=kw["server_pids"]),
             Side("lab", spec=lab_spec(engine_args=kw["engine_args"], name="lab", **lab_kw),
                  engine_args=kw["engine_args"])]
    if kw["with_defaults"]:
        sides.append(Side("lab-defaults", spec=lab_spec(name="lab-defaults", **lab_kw),
                          title="lab defaults"))
    for name, path in also:
        try:
            spec = lab_spec(engine_args=path, name=name, **lab_kw)
        except click.BadParameter as exc:
            exc.param_hint = "'--also-engine-args'"
            raise
        sides.append(Side(name, spec=spec, engine_args=path))
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
    added = added_prompt_tokens(info, workload.tokenizer)
    if added:
        # the target counts (and computes) a prompt with its BOS: so do the lab's frontends
        for side in sides:
            if side.is_lab:
                side.spec.add_special_tokens = True
        kw["added_prompt_tokens"] = added
    run_dir = make_dir(kw["name"], kw["out"])
    from launch.config import write_config

    write_config(run_dir, extra={"fidelity": {
        "target": info.url, "target_disagg": kw["target_disagg"], "model": info.model,
        "engine_args": kw["engine_args"], "also_engine_args": dict(also),
        "speedup": kw["speedup"], "suite": kw["suite"],
        "concurrency": [] if kw["suite"] or arrival.rate or trace.trace else list(concs),
        "rates": arrival.rate, "arrival": arrival.arrival,
        "trace": None if trace.trace is None else str(trace.trace),
        "workload": workload.to_dict(), "requests": kw["n_requests"], "warmup": kw["warmup"],
        "repeat": kw["repeat"], "added_prompt_tokens": added, "argv": sys.argv}})
    if kw["suite"]:
        sys.exit(run_suite(run_dir, sides, workload, info.model, kw))
    plan_of = _plan_maker(concs, workload, arrival, trace, kw)
    sys.exit(run_fidelity(run_dir, sides, plan_of, workload, info.model, kw))


def _check_shape(kw: dict, arrival: ArrivalSettings, trace: TraceSettings) -> None:
    """--conc, --rate, --trace and --suite are alternatives; a usage error names the option."""
    if kw["suite"]:
        given = [f"--{k.replace('_', '-')}" for k in _SUITE_SETS if _given(k)]
        given += ["--rate"] if arrival.rate else []
        given += ["--trace"] if trace.trace is not None else []
        if given:
            raise click.UsageError(f"{', '.join(given)}: --suite sweeps its own workloads "
                                   "(set only --requests, --repeat, --warmup and the sides)")
        return
    if arrival.rate and _given("conc"):
        raise click.UsageError("--conc and --rate are alternatives: a level is a concurrency "
                               "(closed loop) or a request rate (open loop)")
    if kw["conc"] == "auto":
        raise click.BadParameter("auto is `lab sweep`'s SLO search; give the levels, e.g. "
                                 "1,32,128", param_hint="'--conc'")
    if trace.trace is not None:
        from lab.commands.trace import check_trace_conflicts

        check_trace_conflicts(arrival, conc_given=_given("conc"))


def _plan_maker(concs: tuple[int, ...], workload: Any, arrival: ArrivalSettings,
                trace: TraceSettings, kw: dict) -> Any:
    """plan_of(k): the sweep plan of repeat k (its prompts of --seed + k - 1)."""
    client = run_client(kw, kw["timeout_s"])
    trace_plan = None
    if trace.trace is not None:
        from lab.commands.trace import trace_plan as make_trace_plan

        trace_plan = make_trace_plan(trace, workload, kw["n_requests"])
    open_loop = bool(arrival.rate) or trace_plan is not None

    def plan_of(k: int) -> RoundsPlan:
        plan = RoundsPlan(concurrency=[] if open_loop else list(concs),
                          workload=replace(workload, seed=workload.seed + k - 1),
                          requests=kw["n_requests"], warmup=kw["warmup"],
                          client=client,
                          rounds=kw["rounds"], min_requests=kw["min_requests"],
                          rates=arrival.rates, rate_auto=arrival.auto,
                          arrival=arrival.process, max_concurrency=arrival.max_concurrency)
        plan.trace = trace_plan
        return plan

    return plan_of


def fixed_rates(plan: SweepPlan, target_levels: Any) -> SweepPlan:
    """--rate auto, once the target's search ran: the same levels at fixed rates (its closed-
    loop level and every rate it tried), so the lab and later repeats line up with it."""
    from lab.open_loop.rate_search import AUTO_CONCURRENCY

    rates = sorted({float(r) for r in target_levels["rate"].dropna()}) \
        if "rate" in target_levels else []
    return replace(plan, concurrency=[AUTO_CONCURRENCY], rates=rates, rate_auto=False)


@dataclass
class RoundsPlan(SweepPlan):
    """A sweep plan whose levels default to `rounds` rounds of the closed loop."""

    rounds: int = DEFAULT_ROUNDS
    min_requests: int = DEFAULT_MIN_REQUESTS

    def requests_for(self, c: int) -> int:
        if self.requests is not None:
            return self.requests
        return max(self.min_requests, self.rounds * c)


def run_fidelity(run_dir: Path, sides: list[Side], plan_of: Any, workload: Any,
                 model: str, kw: dict) -> int:
    from lab.load.sweep import LineProgress

    say = say_to_stderr(kw["quiet"])
    repeat = kw["repeat"]
    progress = LineProgress(quiet=kw["quiet"])
    fixed: SweepPlan | None = None  # --rate auto: the levels of the target's search
    for k in range(1, repeat + 1):
        plan = plan_of(k)
        if fixed is not None:
            plan = replace(fixed, workload=plan.workload)
        repeat_dir = run_dir if repeat == 1 else run_dir / f"repeat-{k}"
        repeat_of = "" if repeat == 1 else f"repeat {k}/{repeat}, "
        for i, side in enumerate(sides, start=1):
            say(f"{repeat_of}side {i}/{len(sides)}: {side.name}")
            code = run_side(side, [(repeat_dir / side.name, plan, "")], model, progress, say,
                            f"{repeat_of}{side.name}", repeat_dir / side.name)
            if code:
                return code
            if plan.rate_auto:  # the target searched: the lab sides sweep its levels
                from lab.report.comparison import load_run

                fixed = plan = fixed_rates(plan, load_run(repeat_dir / side.name).levels)
                say(f"--rate auto: the lab is swept at the target's levels: c="
                    f"{plan.concurrency[0]} and {', '.join(f'{r:g}' for r in plan.rates or [])}"
                    " req/s")
    text = report(run_dir, sides, workload, kw) if repeat == 1 else \
        report_repeats(run_dir, sides, workload, kw)
    click.echo(text)
    return 0


def run_side(side: Side, jobs: list[tuple[Path, Any, str]], model: str, progress: Any,
             say: Any, what: str, stack_dir: Path) -> int:
    """Sweep `side` with each (run directory, plan, name) job, on one lab stack launched into
    `stack_dir` for a lab side; 0, or the exit code with the error said. Ctrl-C and SIGTERM
    stop it with the stack torn down."""
    import uvloop

    from lab.load.sweep import LevelFailed
    from launch.errors import LaunchError

    try:
        uvloop.run(_sweep_side(side, jobs, model, progress, say, stack_dir))
    except LevelFailed as exc:
        click.echo(f"error: {what}: {exc}", err=True)
        return 1
    except LaunchError as exc:
        click.echo(f"error: the lab stack ({what}) did not start: {exc.message()}", err=True)
        return 1
    except (KeyboardInterrupt, asyncio.CancelledError):
        click.echo("\ninterrupted: the completed sweeps are kept", err=True)
        return 130
    except (RuntimeError, OSError) as exc:
        click.echo(f"error: {what}: {exc}", err=True)
        return 1
    return 0


async def _sweep_side(side: Side, jobs: list[tuple[Path, Any, str]], model: str,
                      progress: Any, say: Any, stack_dir: Path) -> None:
    from lab.fidelity.lab_stack import on_stack
    from lab.load.sweep import SweepRunner
    from lab.sweep.server_sampling import sampling_servers
    from launch.config import write_config

    await _main_task_guard()  # SIGTERM: cancel, so the stack is torn down as on Ctrl-C
    for out, plan, _ in jobs:
        out.mkdir(parents=True, exist_ok=out == stack_dir)
        sweep_cfg = {"sweep": {"name": side.name, "target": side.url, **plan.to_dict()}}
        if side.is_lab:
            write_config(out, side.spec, extra=sweep_cfg)
        else:
            write_config(out, extra={"sweep": {**sweep_cfg["sweep"], "model": model}})

    async def work(url: str, lab_model: str) -> None:
        for out, plan, name in jobs:
            if name:
                say(f"{side.name}: {name}")
            async with sampling_servers(out, side.server_pids) as samples:
                await SweepRunner(out, url, lab_model, plan, progress=progress,
                                  procs_samples=samples).run()

    if not side.is_lab:
        assert side.url is not None  # a target side has its URL
        await work(side.url, model)
        return
    stack_dir.mkdir(parents=True, exist_ok=True)
    await on_stack(side.spec, stack_dir, say, work)


def run_suite(run_dir: Path, sides: list[Side], workload: Any, model: str, kw: dict) -> int:
    """--suite (lab/fidelity/suite.py): the target's saturation, then every side, each on one
    lab stack, sweeps every held-out workload (per repeat); suite.md and suite.json."""
    from lab.fidelity import suite
    from lab.load.sweep import LineProgress
    from lab.load.trace import write_trace
    from lab.load.trace_synth import synth_trace
    from lab.report.comparison import load_run

    say = say_to_stderr(kw["quiet"])
    progress = LineProgress(quiet=kw["quiet"])
    requests, repeat = kw["n_requests"], kw["repeat"]
    client = run_client(kw, kw["timeout_s"])

    def plan(entry_workload: Any, **fields: Any) -> RoundsPlan:
        return RoundsPlan(workload=entry_workload, requests=requests, warmup=kw["warmup"],
                          client=client, rounds=suite.CLOSED_ROUNDS,
                          min_requests=suite.CLOSED_MIN_REQUESTS, **fields)

    target = sides[0]
    sat_workload = replace(workload, isl=suite.SATURATION_ISL, osl=suite.SATURATION_OSL)
    say(f"suite: the target's saturation: c={suite.SATURATION_CONC}, ISL "
        f"{suite.SATURATION_ISL} / OSL {suite.SATURATION_OSL}")
    sat_plan = plan(sat_workload, concurrency=[suite.SATURATION_CONC])
    sat_plan.requests = requests or suite.SATURATION_REQUESTS
    code = run_side(target, [(run_dir / "saturation", sat_plan, "")], model, progress, say,
                    "saturation (target)", run_dir / "saturation")
    if code:
        return code
    from lab.fidelity.gaps import level_value

    saturation = level_value(load_run(run_dir / "saturation").levels, suite.SATURATION_CONC,
                             "req_s")
    if not (math.isfinite(saturation) and saturation > 0):
        click.echo("error: the target's saturation (req/s at c="
                   f"{suite.SATURATION_CONC}) was not measured", err=True)
        return 1
    say(f"suite: the target's saturation is {saturation:.2f} req/s")
    entries = list(suite.SUITE)
    trace_files = {}
    for entry in entries:
        if entry.is_trace:
            path = run_dir / f"{entry.name}.jsonl"
            write_trace(path, synth_trace(suite.trace_spec(entry, saturation, requests,
                                                           workload.seed)))
            trace_files[entry.name] = path

    def entry_plan(entry: suite.SuiteEntry, k: int) -> RoundsPlan:
        w = replace(workload, isl=entry.isl, osl=entry.osl, seed=workload.seed + k - 1)
        if entry.conc:
            return plan(w, concurrency=list(entry.conc))
        if entry.fractions:
            p = plan(w, concurrency=[], rates=entry.rates(saturation))
            p.requests = suite.open_requests(saturation, requests)
            return p
        from lab.commands.trace import trace_plan

        p = plan(w, concurrency=[])
        p.trace = trace_plan(TraceSettings(trace=trace_files[entry.name],
                                           trace_block_size=suite.TRACE_BLOCK_SIZE), w, None)
        return p

    for k in range(1, repeat + 1):
        repeat_dir = run_dir if repeat == 1 else run_dir / f"repeat-{k}"
        repeat_of = "" if repeat == 1 else f"repeat {k}/{repeat}, "
        for i, side in enumerate(sides, start=1):
            say(f"{repeat_of}side {i}/{len(sides)}: {side.name}")
            jobs = [(repeat_dir / e.name / side.name, entry_plan(e, k),
                     f"workload {j}/{len(entries)}: {e.name} ({e.describe(saturation)})")
                    for j, e in enumerate(entries, start=1)]
            code = run_side(side, jobs, model, progress, say, f"{repeat_of}{side.name}",
                            repeat_dir / f"stack-{side.name}")
            if code:
                return code
    text = suite_report(run_dir, sides, entries, saturation, workload, kw)
    click.echo(text)
    return 0


def suite_report(run_dir: Path, sides: list[Side], entries: list[Any], saturation: float,
                 workload: Any, kw: dict) -> str:
    """suite.md / suite.json of a --suite run; returns the markdown."""
    from lab.fidelity import suite
    from lab.report.comparison import load_run

    repeat = kw["repeat"]
    dirs = [run_dir] if repeat == 1 else [run_dir / f"repeat-{k}" for k in range(1, repeat + 1)]
    labs = _lab_sides(sides)
    gaps = {}
    levels: dict[tuple[str, str, int], pd.DataFrame] = {}  # (entry, side, repeat) -> levels
    for entry in entries:
        for k, d in enumerate(dirs, start=1):
            for s in ["target", *(s.name for s in labs)]:
                levels[entry.name, s, k] = load_run(d / entry.name / s).levels
        target = [levels[entry.name, "target", k] for k in range(1, len(dirs) + 1)]
        gaps[entry.name] = {s.name: suite.entry_gaps(
            target, [levels[entry.name, s.name, k] for k in range(1, len(dirs) + 1)],
            entry.is_trace) for s in labs}
    rows = suite.suite_rows(gaps, entries)
    stats = suite.summary(rows, [s.name for s in labs])
    also = "".join(f"; {n}: {f}" for n, f in _also(kw))
    spread = (f"the target's spread is its range over the {repeat} repeats (max - min, % of "
              "its median), and values are medians over them" if repeat > 1 else
              "the target's spread needs --repeat 2 or more")
    intro = [f"# Fidelity suite: the lab against {kw['target']}", "",
             f"Held-out workloads ({workload.endpoint}, {workload.prompt_kind} prompts). The "
             f"target's saturation: {saturation:.2f} req/s, its achieved req/s at c="
             f"{suite.SATURATION_CONC}, ISL {suite.SATURATION_ISL} / OSL "
             f"{suite.SATURATION_OSL} (saturation/), measured first.", ""]
    intro += [f"* `{e.name}`: {e.describe(saturation)}" for e in entries]
    intro += ["", f"Lab engine args: {kw['engine_args'] or 'defaults'}{also}, speedup "
              f"{kw['speedup']:g}. Gap = (lab - target) / target; {spread}.",
              *_added_tokens_line(kw), ""]
    text = suite.suite_markdown(rows, [(s.name, s.column) for s in labs], stats, intro)
    text += client_health_notes(levels, repeat)
    text += target_wait_notes([(f"{entry}" + (f", repeat {k}" if repeat > 1 else ""), lv)
                               for (entry, side, k), lv in levels.items() if side == "target"])
    text += f"\nRun directory: {run_dir}\n"
    suite.write_suite(run_dir, text, {
        "target": kw["target"], "repeat": repeat,
        "added_prompt_tokens": kw.get("added_prompt_tokens", 0),
        "saturation": {"concurrency": suite.SATURATION_CONC, "isl": suite.SATURATION_ISL,
                       "osl": suite.SATURATION_OSL, "req_s": saturation},
        "workloads": [{"name": e.name, "describe": e.describe(saturation), "isl": e.isl,
                       "osl": e.osl, "concurrency": list(e.conc),
                       "rates": e.rates(saturation) if e.fractions else [],
                       "trace": str(run_dir / f"{e.name}.jsonl") if e.is_trace else None}
                      for e in entries],
        "sides": {s.name: {"title": s.column, "engine_args": s.engine_args} for s in labs},
        "rows": [r.to_dict() for r in rows], "summary": stats})
    return text


def client_health_notes(levels: dict[tuple[str, str, int], pd.DataFrame], repeat: int) -> str:
    """The sweeps whose load client did not keep up (lab.report.markdown.client_sentence): a
    lagging event loop on the target's side (a CPU engine that busy-polls both cores can starve
    the client) delays its timestamps, so those levels' gaps are the client's as much as the
    engine's. Empty when every client kept up."""
    from lab.report.markdown import client_kept_up, client_sentence

    notes = []
    for (entry, side, k), lv in levels.items():
        if not client_kept_up(lv):
            where = f"{entry}, {side}" + (f", repeat {k}" if repeat > 1 else "")
            notes.append(f"* {where}: {client_sentence(lv)}")
    if not notes:
        return "\nClient health: every sweep's client kept up.\n"
    return "\n".join(["", "## Client health", "", *notes, ""])


def target_wait_notes(sweeps: list[tuple[str, pd.DataFrame]]) -> str:
    """The target sweeps' CPU wait (--server-pid; lab.report.markdown `waited_levels`): the
    levels where a sampled target process spent SERVER_WAIT_SHARE or more of its runnable time
    waiting for a core. A CPU engine beside the load client on a small machine stretches its
    passes by that wait, which its probes saw in another measure, so a gap there can be the
    machine's. Empty without sampled processes."""
    from lab.report.markdown import SERVER_WAIT_SHARE, server_wait_shares, waited_levels

    sampled = [(where, shares) for where, lv in sweeps if (shares := server_wait_shares(lv))]
    if not sampled:
        return ""
    notes = [f"* {where}: " + "; ".join(waited)
             for where, shares in sampled if (waited := waited_levels(shares))]
    head = ["", "## The target's CPU wait", "",
            "Share of the time runnable that a sampled target process (--server-pid) spent "
            "waiting for a CPU (run-queue wait / (CPU + wait)), where it reached "
            f"{SERVER_WAIT_SHARE:.0%}: there the target's timing carries the machine's "
            "contention as well as its work."]
    if not notes:
        return "\n".join([*head, "", f"No sampled target process reached {SERVER_WAIT_SHARE:.0%}"
                          " at any level.", ""])
    return "\n".join([*head, "", *notes, ""])


def _lab_sides(sides: list[Side]) -> list[Side]:
    """The lab sides compared with the (aggregated) target, in order."""
    return [s for s in sides if s.is_lab and s.name != "lab-disagg"]


def _level_cell(g: Any, header: str) -> str:
    """A level's cell: its concurrency under "conc", else 'c=32', 'rate=2/s' or 'trace'."""
    return str(g.concurrency) if header == "conc" else g.level


def _level_header(gaps: list[Any]) -> str:
    return "conc" if all(g.rate is None for g in gaps) else "level"


def report(run_dir: Path, sides: list[Side], workload: Any, kw: dict) -> str:
    """fidelity.md / fidelity.json / plots; returns the markdown."""
    from lab.fidelity.gaps import Gap, disagg_cost, level_gaps
    from lab.report.comparison import compare_runs, load_run
    from lab.report.markdown import fnum, md_table

    runs = {s.name: load_run(run_dir / s.name) for s in sides}
    trace = _is_trace(runs["target"].config)
    target = runs["target"].levels
    labs = _lab_sides(sides)
    gaps = {s.name: level_gaps(target, runs[s.name].levels, trace=trace) for s in labs}
    lines = _intro(workload, kw, runs["target"].config)
    axis = _level_header(gaps["lab"])
    header = [axis, "metric", "target"]
    for s in labs:
        header += [s.column, "gap", "verdict"]
    rows = []
    for i, g in enumerate(gaps["lab"]):
        row = [_level_cell(g, axis), g.label, fnum(g.target, 2)]
        for s in labs:
            d = gaps[s.name][i] if i < len(gaps[s.name]) else None
            row += ["-", "-", "n/a"] if d is None else [fnum(d.lab, 2), _pct(d.gap_pct),
                                                        d.verdict]
        rows.append(row)
    lines += [md_table(header, rows), ""]
    costs: dict[str, dict[int, float]] = {}
    dgaps: list[Gap] = []
    if "target-disagg" in runs and "lab-disagg" in runs:
        costs = {"target": disagg_cost(target, runs["target-disagg"].levels),
                 "lab": disagg_cost(runs["lab"].levels, runs["lab-disagg"].levels)}
        lines += _cost_section(costs, "## Disaggregation cost (req/s lost vs aggregated)")
        dgaps = level_gaps(runs["target-disagg"].levels, runs["lab-disagg"].levels, trace=trace)
        lines += ["## Disaggregated, level by level", "",
                  md_table([_level_header(dgaps), "metric", "target", "lab", "gap", "verdict"],
                           [[_level_cell(g, _level_header(dgaps)), g.label, fnum(g.target, 2),
                             fnum(g.lab, 2), _pct(g.gap_pct), g.verdict] for g in dgaps]), ""]
    if not kw["no_plots"]:
        from lab.fidelity.plots import fidelity_plot

        plot = fidelity_plot([(n, r.levels) for n, r in runs.items()],
                             run_dir / "plots" / "fidelity.png",
                             f"ISL {workload.isl} / OSL {workload.osl}")
        lines += [f"![fidelity]({plot.relative_to(run_dir)})", ""]
    compare_runs([run_dir / s.name for s in sides], run_dir / "compare",
                 make_plots=not kw["no_plots"])
    waits = target_wait_notes([(name, runs[name].levels) for name in ("target", "target-disagg")
                               if name in runs])
    if waits:
        lines += [waits]
    lines += [f"Run directory: {run_dir} (overlay plots in compare/).", ""]
    text = "\n".join(lines)
    (run_dir / "fidelity.md").write_text(text)
    (run_dir / "fidelity.json").write_text(json.dumps(
        {"gaps": {k: [g.to_dict() for g in v] for k, v in gaps.items()},
         "disagg_gaps": [g.to_dict() for g in dgaps],
         "disagg_cost_pct": {k: {str(c): v for c, v in d.items()} for k, d in costs.items()}},
        indent=2, default=str) + "\n")
    return text


def _is_trace(config: dict | None) -> bool:
    return bool(((config or {}).get("sweep") or {}).get("trace"))


def _cost_section(costs: dict[str, dict[int, float]], title: str) -> list[str]:
    """The disaggregation cost of target and lab, side by side, under `title`."""
    from lab.report.markdown import md_table

    rows = [[str(c), _pct(costs["target"].get(c, math.nan)), _pct(costs["lab"].get(c, math.nan))]
            for c in sorted(set(costs["target"]) | set(costs["lab"]))]
    return [title, "", md_table(["conc", "target", "lab"], rows) if rows else
            "No level at c=32 or c=128 in both sweeps.", ""]


def _intro(workload: Any, kw: dict, config: dict | None = None) -> list[str]:
    sweep = (config or {}).get("sweep") or {}
    if sweep.get("trace"):
        t = sweep["trace"]
        shape = (f"Load: replay of {t['path']} ({t['requests']} requests at {t['speed']:g}x, "
                 f"offered {t['offered_req_s']:.2f} req/s); levels line up as the replay. ")
        what = f"Workload: the trace's lengths, {workload.endpoint}"
    elif sweep.get("rates"):
        shape = (f"Load: open loop, {sweep.get('arrival')} arrivals; levels line up by offered "
                 "rate. ")
        what = f"Workload: ISL {workload.isl}, OSL {workload.osl}, {workload.endpoint}"
    else:
        shape = ""
        what = f"Workload: ISL {workload.isl}, OSL {workload.osl}, {workload.endpoint}"
    also = "".join(f", {n}: {f}" for n, f in _also(kw))
    return [f"# Fidelity: the lab against {kw['target']}", "",
            f"{what}, {workload.prompt_kind} prompts; lab engine args: "
            f"{kw['engine_args'] or 'defaults'}{also}, speedup {kw['speedup']:g}. {shape}"
            "Gap = (lab - target) / target.", *_added_tokens_line(kw), ""]


def _added_tokens_line(kw: dict) -> list[str]:
    added = kw.get("added_prompt_tokens", 0)
    if not added:
        return []
    return ["", f"The target counted {added} more prompt token(s) than the workload's ISL (its "
            "tokenizer's special tokens, a BOS): the lab's frontends encode prompts with them "
            "too (`--add-special-tokens`), so both sides compute the same tokens."]


def _also(kw: dict) -> list[tuple[str, str]]:
    return [(v.partition("=")[0], v.partition("=")[2]) for v in kw.get("also") or ()]


def _repeat_pairs(sides: list[Side]) -> list[tuple[str, str, str]]:
    """(lab side, the side it is compared with, the section's title) of a report over
    repeats."""
    titles = {"lab": "The lab against the target",
              "lab-defaults": "The lab with its default engine args"}
    pairs = [(s.name, "target", titles.get(s.name) or
              f"The lab with {s.name}'s engine args ({s.engine_args})")
             for s in _lab_sides(sides)]
    return [*pairs, ("lab-disagg", "target-disagg", "Disaggregated, level by level")]


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
    config = load_run(run_dir / "repeat-1" / "target").config
    trace = _is_trace(config)
    lines = [
        *_intro(workload, kw, config),
        f"Over {repeat} repeats (repeat-1/ ... repeat-{repeat}/, each side swept in turn): "
        "the target and lab columns are medians over the repeats, the gap is theirs, with "
        "its 95% bootstrap interval (repeats resampled in pairs), and the median of the "
        "per-repeat gaps beside it; the verdict is on the gap. The target's spread is its own "
        "range over the repeats (max - min, % of its median): one sweep does not resolve a "
        "gap smaller than that.", ""]
    gaps = {}
    for lab, target, title in _repeat_pairs(sides):
        if lab not in repeats or target not in repeats:
            continue
        gaps[lab] = repeat_gaps(repeats[target], repeats[lab], trace=trace)
        axis = _level_header(gaps[lab])
        header = [axis, "metric", "target", "lab", "gap", "95% interval", "per-repeat gap",
                  "target's spread", "verdict"]
        rows = [[_level_cell(g, axis), g.label, fnum(g.target, 2), fnum(g.lab, 2),
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
    waits = target_wait_notes([(f"{name}, repeat {k}", lv) for name in ("target", "target-disagg")
                               if name in repeats for k, lv in enumerate(repeats[name], start=1)])
    if waits:
        lines += [waits]
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
