"""`lab sweep`: launch a stack (or use --target), drive each concurrency level, and leave a run
directory that answers "where is the knee, and what does disaggregation cost?"."""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click

from lab.analysis.knee import DEFAULT_THRESHOLD as KNEE_THRESHOLD
from lab.commands.shard import shard_options, sharded
from lab.commands.shard import start as shard_start
from lab.commands.target import prompt_form_options, target_or_exit, workload_from_options
from lab.load.client import ClientOptions
from lab.load.workload import WorkloadSpec
from launch.cli_options import TOPOLOGY_OPTION_NAMES, spec_from_options, topology_options
from launch.faults import ENGINE_ONLY, FAULT_KINDS

DEFAULT_CONC = "1,32,128,256"
DEFAULT_ISL = WorkloadSpec.isl
DEFAULT_OSL = WorkloadSpec.osl
# topology options that make sense with --target (the rest would be silently ignored)
_TARGET_OK = {"model", "name", "tokenizer"}
_FAULT_RE = re.compile(r"^(?P<proc>[A-Za-z0-9_.-]+):(?P<kind>[a-z-]+)@(?P<num>\d+(?:\.\d+)?)"
                       r"(?P<unit>ms|s)?$")


#: The most requests in flight one level may ask for (and requests per level).
MAX_CONCURRENCY = 10_000
MAX_REQUESTS = 10_000_000

# ----- parsing -----

def parse_conc(value: str) -> list[int]:
    """'1,32,128' -> [1, 32, 128] (sorted, unique); BadParameter naming --conc otherwise."""
    items = [v.strip() for v in str(value).split(",")]
    if not any(items):
        raise click.BadParameter("expected a comma-separated list of positive integers, e.g. "
                                 "1,32,128,256", param_hint="'--conc'")
    if not all(items):
        raise click.BadParameter(f"{value!r} has an empty item (expected e.g. 1,32,128,256)",
                                 param_hint="'--conc'")
    out = []
    for item in items:
        try:
            n = int(item)
        except ValueError:
            raise click.BadParameter(f"{item!r} is not an integer (expected e.g. 1,32,128,256)",
                                     param_hint="'--conc'") from None
        if n < 1:
            raise click.BadParameter(f"{n} is not a positive concurrency", param_hint="'--conc'")
        if n > MAX_CONCURRENCY:
            raise click.BadParameter(f"{n} exceeds the limit of {MAX_CONCURRENCY} requests in "
                                     "flight (each holds a connection and its buffers)",
                                     param_hint="'--conc'")
        out.append(n)
    return sorted(set(out))


@dataclass(frozen=True)
class FaultSpec:
    process: str
    kind: str
    at_s: float

    def __str__(self) -> str:
        return f"{self.process}:{self.kind}@{self.at_s:g}s"


def parse_faults(values: tuple[str, ...]) -> list[FaultSpec]:
    """'engine-decode-0:kill@10s' (also @500ms, @10; several per option, comma-separated)."""
    out = []
    for value in values:
        for item in (v.strip() for v in value.split(",")):
            if not item:
                continue
            m = _FAULT_RE.match(item)
            if not m:
                raise click.BadParameter(
                    f"{item!r}: expected PROCESS:KIND@TIME, e.g. engine-decode-0:kill@10s",
                    param_hint="'--fault'")
            kind = m["kind"]
            if kind not in FAULT_KINDS:
                raise click.BadParameter(
                    f"{item!r}: unknown kind {kind!r} (kinds: {', '.join(FAULT_KINDS)})",
                    param_hint="'--fault'")
            at = float(m["num"]) / (1000.0 if m["unit"] == "ms" else 1.0)
            out.append(FaultSpec(m["proc"], kind, at))
    return sorted(out, key=lambda f: f.at_s)


def process_names(spec: Any) -> dict[str, str]:
    """name -> role of every process the launcher will start for `spec`."""
    names = {"frontend": "frontend"}
    for _, suffix in spec.workers():
        names[f"engine-{suffix}"] = "engine"
        names[f"sidecar-{suffix}"] = "sidecar"
    return names


def check_faults(faults: list[FaultSpec], spec: Any) -> None:
    names = process_names(spec)
    for f in faults:
        if f.process not in names:
            raise click.BadParameter(
                f"{f}: no process {f.process!r} in this topology (processes: "
                f"{', '.join(sorted(names))})", param_hint="'--fault'")
        if f.kind in ENGINE_ONLY and names[f.process] != "engine":
            raise click.BadParameter(f"{f}: {f.kind!r} applies to engines only",
                                     param_hint="'--fault'")


# ----- the command -----

def _positive(name: str, value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise click.BadParameter(f"must be a finite number > 0 (got {value:g})",
                                 param_hint=f"'{name}'")


@click.command()
@click.option("--conc", default=DEFAULT_CONC, show_default=True, metavar="LIST",
              help="Concurrency levels (requests in flight), comma-separated.")
@topology_options
@shard_options
@click.option("--isl", type=int, default=DEFAULT_ISL, show_default=True,
              help="Input (prompt) tokens per request: exact in --tokenizer's tokenizer when "
              "given, else in the lab frontend's word tokenizer.")
@click.option("--osl", type=int, default=DEFAULT_OSL, show_default=True,
              help="Output tokens per request (max_tokens = min_tokens, ignore_eos).")
@click.option("--isl-stddev", type=float, default=0.0, show_default=True,
              help="Standard deviation of the prompt length (normal, clipped to >= 1).")
@click.option("--osl-stddev", type=float, default=0.0, show_default=True,
              help="Standard deviation of the output length (normal, clipped to >= 1).")
@click.option("--requests", "n_requests", type=int, default=None,
              help="Measured requests per level.  [default: max(100, 8 x concurrency)]")
@click.option("--duration", type=float, default=None, metavar="SECONDS",
              help="Run each level this long instead of a request count.")
@click.option("--warmup", type=int, default=None,
              help="Warm-up requests per level, excluded from statistics.  "
              "[default: the level's concurrency]")
@click.option("--repeat", type=int, default=1, show_default=True,
              help="Run each level K times; the report shows the spread.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Workload seed (prompts and lengths are deterministic for a seed).")
@click.option("--shared-prefix", type=int, default=0, show_default=True, metavar="TOKENS",
              help="Tokens of prompt prefix shared by every request (prefix-cache hits).")
@prompt_form_options
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Run directory (must not exist or be empty).  "
              "[default: results/<timestamp>-<name>]")
@click.option("--target", default=None, metavar="URL",
              help="Sweep an external OpenAI-compatible server (nothing launched; use --model).")
@click.option("--server-pid", "server_pids", multiple=True, metavar="NAME=PID",
              help="With --target: sample this server process (and its children) for the "
              "report's server CPU, e.g. --server-pid frontend=1234 --server-pid engine=1240 "
              "(repeatable).")
@click.option("--client-procs", type=int, default=1, show_default=True, metavar="K",
              help="Spread each level over K client processes.")
@click.option("--fresh-connection", is_flag=True, default=False,
              help="Open a new HTTP connection per request (default: keep-alive, one pool).")
@click.option("--in-process-client", is_flag=True, default=False,
              help="Run the load client inside the sweep process (default: a child process, so "
              "the client's CPU and loop-lag figures are its own, not the launcher's).")
@click.option("--gap-ms", type=float, default=0.0, show_default=True,
              help="Idle time between a slot's response and its next request.")
@click.option("--timeout", "timeout_s", type=float, default=ClientOptions.timeout_s,
              show_default=True,
              metavar="SECONDS", help="Per-request timeout.")
@click.option("--slo-ttft-ms", type=float, default=None, help="TTFT SLO for goodput.")
@click.option("--slo-latency-ms", type=float, default=None, help="Latency SLO for goodput.")
@click.option("--slo-itl-ms", type=float, default=None, help="ITL SLO for goodput.")
@click.option("--knee-threshold", type=float, default=KNEE_THRESHOLD, show_default=True,
              help="Marginal-efficiency threshold of the knee rule.")
@click.option("--compare-disagg", is_flag=True, default=False,
              help="Run the sweep aggregated, then disaggregated (--prefill/--decode), and "
              "compare them.")
@click.option("--fault", "faults", multiple=True, metavar="PROC:KIND@TIME",
              help="Inject a fault during the sweep, e.g. engine-decode-0:kill@10s (TIME from "
              "the first level's start; repeatable or comma-separated).")
@click.option("--no-plots", is_flag=True, default=False, help="Skip the PNG plots.")
@click.option("--quiet", is_flag=True, default=False, help="No live progress lines.")
def sweep(**kw: Any) -> None:
    """Sweep concurrency levels against the lab's stack (launched here) or a --target.

    Writes results/<run>/: config.json, requests.parquet, levels.csv/json, client.json,
    procs.parquet, plots/*.png, report.md, logs/. Prints the results table and the knee.
    """
    concs = sharded(parse_conc(kw["conc"]), kw)
    for name, key in (("--isl", "isl"), ("--osl", "osl"), ("--requests", "n_requests"),
                      ("--duration", "duration"), ("--repeat", "repeat"),
                      ("--client-procs", "client_procs"), ("--timeout", "timeout_s"),
                      ("--knee-threshold", "knee_threshold"), ("--slo-ttft-ms", "slo_ttft_ms"),
                      ("--slo-latency-ms", "slo_latency_ms"), ("--slo-itl-ms", "slo_itl_ms")):
        _positive(name, kw[key])
    for name, key in (("--warmup", "warmup"), ("--shared-prefix", "shared_prefix"),
                      ("--isl-stddev", "isl_stddev"), ("--osl-stddev", "osl_stddev"),
                      ("--gap-ms", "gap_ms")):
        if kw[key] is not None and not (math.isfinite(kw[key]) and kw[key] >= 0):
            raise click.BadParameter(f"must be a finite number >= 0 (got {kw[key]:g})",
                                     param_hint=f"'{name}'")
    if kw["shared_prefix"] > kw["isl"]:
        raise click.BadParameter(f"{kw['shared_prefix']} exceeds --isl {kw['isl']} (the shared "
                                 "prefix is part of the prompt)", param_hint="'--shared-prefix'")
    if kw["n_requests"] is not None and kw["n_requests"] > MAX_REQUESTS:
        raise click.BadParameter(f"{kw['n_requests']} exceeds the limit of {MAX_REQUESTS}",
                                 param_hint="'--requests'")
    if kw["n_requests"] is not None and kw["duration"] is not None:
        raise click.UsageError("--requests and --duration are alternatives: give one")
    faults = parse_faults(kw["faults"])
    target = kw["target"]
    if target:
        given = sorted(k for k in TOPOLOGY_OPTION_NAMES - _TARGET_OK if kw.get(k) is not None)
        if given:
            flags = ", ".join("--" + k.replace("_", "-") for k in given)
            raise click.UsageError(f"{flags}: topology options have no effect with --target "
                                   "(nothing is launched)")
        if faults:
            raise click.UsageError("--fault needs a launched stack (not --target)")
    elif kw["server_pids"]:
        raise click.UsageError("--server-pid is for --target runs (a launched stack is sampled "
                               "anyway)")
    server_pids = parse_server_pids(kw["server_pids"])
    if target and kw["compare_disagg"]:
        raise click.UsageError("--compare-disagg needs a launched stack (not --target)")

    workload = workload_from_options(kw, target=target)
    from lab.load.sweep import SweepPlan

    plan = SweepPlan(
        concurrency=concs, workload=workload, requests=kw["n_requests"],
        duration_s=kw["duration"], warmup=kw["warmup"], repeat=kw["repeat"],
        client=ClientOptions(fresh_connection=kw["fresh_connection"], gap_ms=kw["gap_ms"],
                             timeout_s=kw["timeout_s"], procs=kw["client_procs"],
                             isolate=not kw["in_process_client"]),
    )
    slos = {k: kw[f"slo_{k}"] for k in ("ttft_ms", "latency_ms", "itl_ms")
            if kw[f"slo_{k}"] is not None}
    name = kw.get("name") or ("target" if target else "lab")
    if target:
        info = target_or_exit(target, kw.get("model"), workload, kw["timeout_s"],
                              quiet=kw["quiet"])
        plan.workload = replace(workload, include_usage=info.include_usage)
        run_dir = make_dir(name, kw["out"])
        shard_start(run_dir, kw)
        code = run_target(run_dir, info.url, info.model, plan, slos, kw, info.to_dict(),
                          server_pids)
    elif kw["compare_disagg"]:
        agg_kw = {**kw, "disagg": None, "prefill": None, "decode": None}
        dis_kw = {**kw, "disagg": True, "engines": None}
        specs = [("aggregated", spec_from_options(**agg_kw)),
                 ("disaggregated", spec_from_options(**dis_kw))]
        for _, spec in specs:
            check_faults(faults, spec)
        run_dir = make_dir(name, kw["out"])
        code = run_compare_disagg(run_dir, specs, plan, slos, faults, kw)
    else:
        spec = spec_from_options(**kw)
        check_faults(faults, spec)
        run_dir = make_dir(name, kw["out"])
        code = run_launched(run_dir, spec, plan, slos, faults, kw)
    sys.exit(code)



# ----- running -----

def make_dir(name: str, out: Path | None) -> Path:
    from launch.errors import RunError
    from launch.rundir import make_run_dir

    try:
        return make_run_dir(name, out)
    except RunError as exc:
        raise click.BadParameter(str(exc).removeprefix(f"--out {out}: "),
                                 param_hint="'--out'") from None
    except OSError as exc:
        raise click.BadParameter(f"cannot create the run directory: {exc}",
                                 param_hint="'--out'") from None


def _sweep_config(plan: Any, slos: dict, faults: list[FaultSpec], kw: dict, *,
                  target: str | None = None, model: str | None = None,
                  target_check: dict | None = None) -> dict:
    return {
        "name": kw.get("name"),
        "target": target,
        "model": model,
        "target_check": target_check,
        **plan.to_dict(),
        "slos": slos,
        "knee_threshold": kw["knee_threshold"],
        "faults": [str(f) for f in faults],
        "argv": sys.argv,
    }


def _echo(text: str = "", err: bool = False) -> None:
    click.echo(text, err=err)


def _print_results(run_dir: Path, title: str | None = None, make_plots: bool = True) -> Any:
    """Rebuild the analysis of a (possibly partial) run and print the table and the knee."""
    from lab.analysis.rundir import REQUESTS
    from lab.report.build import build_run, summary_lines
    from lab.report.markdown import client_sentence, results_table

    if not (run_dir / REQUESTS).exists():
        _echo(f"no level completed; run directory: {run_dir}", err=True)
        return None
    analysis = build_run(run_dir, title=title, make_plots=make_plots)
    _echo()
    if title:
        _echo(f"## {title}")
    _echo(results_table(analysis.table))
    _echo()
    for line in summary_lines(analysis):
        _echo(line)
    _echo(client_sentence(analysis.table))
    if analysis.tokens is not None and (analysis.tokens.flagged
                                        or analysis.config.get("sweep", {}).get("target")):
        for line in analysis.tokens.sentences():
            _echo("tokens: " + line.replace("**", ""))
    if analysis.faults is not None:
        _echo()
        _echo(analysis.faults.markdown().rstrip())
    _echo(f"run directory: {run_dir}  (report: {run_dir / 'report.md'})")
    return analysis


async def _inject(stack: Any, faults: list[FaultSpec], t0: float, progress: Any) -> None:
    for f in faults:
        delay = t0 + f.at_s - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        try:
            what = await stack.fault(f.process, f.kind)
            progress.done(f"fault injected at {f.at_s:g} s: {what}")
        except Exception as exc:  # a failed injection must not stop the sweep
            progress.done(f"fault {f} could not be injected: {exc}")


def _event_printer(progress: Any) -> Any:
    shown = {"fault", "exit", "restart", "withdrawn", "registered", "kill"}

    def listener(event: dict) -> None:
        if event.get("event") not in shown:
            return
        extra = f" code={event['code']}" if event.get("code") is not None else ""
        progress.done(f"  [{event['event']}] {event.get('name', '')}{extra}")

    return listener


async def _main_task_guard() -> asyncio.Task:
    """SIGTERM ends the sweep like Ctrl-C: cancel, tear the stack down, keep completed levels."""
    import signal

    task = asyncio.current_task()
    assert task is not None
    with contextlib.suppress(NotImplementedError, RuntimeError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return task


async def _launched(run_dir: Path, spec: Any, plan: Any, faults: list[FaultSpec],
                    quiet: bool) -> None:
    from lab.load.sweep import LineProgress, SweepRunner
    from launch.stack import Stack

    await _main_task_guard()
    progress = LineProgress(quiet=quiet)
    if not quiet:
        _echo(f"launching {spec.name}: " + ", ".join(
            f"{f.count}x {f.role}" for f in spec.fleets) + f" -> {run_dir}", err=True)
    async with Stack(spec, run_dir) as stack:
        if not quiet:
            _echo(f"stack ready: {stack.frontend_url} (model {stack.model})", err=True)
            stack.on_event(_event_printer(progress))
        runner = SweepRunner(run_dir, stack.frontend_url, stack.model, plan, progress=progress,
                             procs_samples=stack.cpu_samples)
        t0 = time.monotonic()
        async with asyncio.TaskGroup() as tg:
            injector = tg.create_task(_inject(stack, faults, t0, progress)) if faults else None
            await runner.run()
            if injector is not None and not injector.done():
                pending = [str(f) for f in faults if t0 + f.at_s > time.monotonic()]
                progress.done(f"warning: the sweep ended before these faults fired: "
                              f"{', '.join(pending)}")
                injector.cancel()


def _run(coro_factory: Any) -> int:
    """Run the sweep's coroutine under uvloop; map failures to exit codes and messages."""
    import uvloop

    from launch.errors import LaunchError

    try:
        uvloop.run(coro_factory())
    except LaunchError as exc:
        _echo(f"error: {exc.message()}", err=True)
        return 1
    except (KeyboardInterrupt, asyncio.CancelledError):
        _echo("\ninterrupted: the completed levels are kept", err=True)
        return 130
    except (RuntimeError, OSError) as exc:  # a client process or the run directory failed
        _echo(f"error: {exc}; the completed levels are kept", err=True)
        return 1
    return 0


def run_launched(run_dir: Path, spec: Any, plan: Any, slos: dict, faults: list[FaultSpec],
                 kw: dict, title: str | None = None) -> int:
    from launch.config import write_config

    write_config(run_dir, spec, extra={"sweep": _sweep_config(plan, slos, faults, kw)})
    code = _run(lambda: _launched(run_dir, spec, plan, faults, kw["quiet"]))
    _print_results(run_dir, title, make_plots=not kw["no_plots"])
    return code


def parse_server_pids(values: tuple[str, ...]) -> dict[str, int]:
    """NAME=PID pairs of --server-pid; a clear error for a malformed pair or a missing pid."""
    import psutil

    out: dict[str, int] = {}
    for value in values:
        name, sep, pid = value.partition("=")
        if not sep or not name or not pid.isdigit():
            raise click.BadParameter(f"{value!r}: expected NAME=PID, e.g. frontend=1234",
                                     param_hint="'--server-pid'")
        if name in out:
            raise click.BadParameter(f"{name!r} is given twice", param_hint="'--server-pid'")
        if not psutil.pid_exists(int(pid)):
            raise click.BadParameter(f"{value!r}: no process {pid}", param_hint="'--server-pid'")
        out[name] = int(pid)
    return out


async def _targeted(run_dir: Path, target: str, model: str, plan: Any, quiet: bool,
                    server_pids: dict[str, int]) -> None:
    from lab.load.sweep import LineProgress, SweepRunner

    await _main_task_guard()
    if not server_pids:
        runner = SweepRunner(run_dir, target, model, plan, progress=LineProgress(quiet=quiet))
        await runner.run()
        return
    import psutil

    from launch.process import ProcessView
    from launch.sampler import Sampler

    views = [ProcessView(name, "server", None, pid, None, "ready", 0,
                         create_time=psutil.Process(pid).create_time())
             for name, pid in server_pids.items()]
    sampler = Sampler(lambda: views, run_dir / "procs.parquet", include_children=True)
    runner = SweepRunner(run_dir, target, model, plan, progress=LineProgress(quiet=quiet),
                         procs_samples=lambda: list(sampler.samples))
    async with asyncio.TaskGroup() as tg:
        sampling = tg.create_task(sampler.run())
        try:
            await runner.run()
        finally:
            sampling.cancel()
    sampler.sample_once()
    await asyncio.to_thread(sampler.write)


def run_target(run_dir: Path, target: str, model: str, plan: Any, slos: dict, kw: dict,
               target_check: dict | None = None,
               server_pids: dict[str, int] | None = None) -> int:
    from launch.config import write_config

    write_config(run_dir, extra={"sweep": _sweep_config(plan, slos, [], kw, target=target,
                                                        model=model, target_check=target_check)})
    code = _run(lambda: _targeted(run_dir, target, model, plan, kw["quiet"],
                                  server_pids or {}))
    _print_results(run_dir, make_plots=not kw["no_plots"])
    return code


def run_compare_disagg(run_dir: Path, specs: list[tuple[str, Any]], plan: Any, slos: dict,
                       faults: list[FaultSpec], kw: dict) -> int:
    """Both topologies into run_dir/<mode>/, then the comparison into run_dir/compare/."""
    from lab.report.comparison import compare_runs

    dirs = []
    for mode, spec in specs:
        sub = run_dir / mode
        sub.mkdir()
        spec.name = f"{spec.name}-{mode}"
        code = run_launched(sub, spec, plan, slos, faults, kw, title=mode)
        if code != 0:
            return code
        dirs.append(sub)
    _echo()
    result = compare_runs(dirs, run_dir / "compare", make_plots=not kw["no_plots"])
    _echo(result.text)
    return 0
