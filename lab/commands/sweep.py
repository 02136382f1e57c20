"""`lab sweep`: launch a stack (or use --target), drive each concurrency level, and leave a run
directory that answers "where is the knee, and what does disaggregation cost?".

The options are generated from `SweepSettings` (lab.sweep.sweep_settings), the load client's
`ClientSettings` (lab.load.client_settings) and the topology options (launch.cli_options)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from lab.analysis.slo_share import SLOs
from lab.load.client_settings import ClientSettings
from lab.load.conversation_settings import ConversationSettings
from lab.load.ray_settings import RaySettings
from lab.load.trace_settings import TraceSettings
from lab.open_loop.arrival_settings import ArrivalSettings
from lab.shared.config_cli import flag_of, options
from lab.sweep.shard import ShardPlan, ShardSettings, plan_shard
from lab.sweep.shard import start as shard_start
from lab.sweep.sweep_settings import (
    FaultSpec,
    SweepSettings,
    parse_conc,
    parse_faults,
    parse_server_pids,
)
from lab.sweep.target import target_or_exit, workload_from_options
from launch.cli_options import TOPOLOGY_OPTION_NAMES, spec_from_options, topology_options
from launch.faults import ENGINE_ONLY
from launch.topology import TopologySpec
from launch.topology_settings import TopologySettings

if TYPE_CHECKING:  # lab.load.sweep imports pandas: not for `lab sweep --help`
    from collections.abc import Iterator

    from lab.load.client import RemoteClients
    from lab.load.sweep import LineProgress, SweepPlan
    from lab.load.workload import WorkloadSpec
    from launch.stack import Stack

__all__ = ["parse_conc", "parse_faults", "parse_server_pids", "sweep"]

# topology options that make sense with --target (the rest would be silently ignored)
_TARGET_OK = {"model", "name", "tokenizer"}
_WORKLOAD_FIELDS = ("isl", "osl", "isl_stddev", "osl_stddev", "seed", "shared_prefix",
                    "prompt_kind", "endpoint")


def process_names(spec: TopologySpec) -> dict[str, str]:
    """name -> role of every process the launcher will start for `spec`."""
    names = {"frontend": "frontend"}
    for _, suffix in spec.workers():
        names[f"engine-{suffix}"] = "engine"
        names[f"sidecar-{suffix}"] = "sidecar"
    return names


def check_faults(faults: tuple[FaultSpec, ...], spec: TopologySpec) -> None:
    names = process_names(spec)
    for f in faults:
        if f.process not in names:
            raise click.BadParameter(
                f"{f}: no process {f.process!r} in this topology (processes: "
                f"{', '.join(sorted(names))})", param_hint="'--fault'")
        if f.kind in ENGINE_ONLY and names[f.process] != "engine":
            raise click.BadParameter(f"{f}: {f.kind!r} applies to engines only",
                                     param_hint="'--fault'")


def _check_target_mode(settings: SweepSettings, topology: dict[str, Any]) -> None:
    """The options that need a launched stack, or only make sense with --target."""
    if settings.target:
        given = sorted(k for k in TOPOLOGY_OPTION_NAMES - _TARGET_OK
                       if topology.get(k) is not None)
        if given:
            flags = ", ".join(flag_of(TopologySettings, k) for k in given)
            raise click.UsageError(f"{flags}: topology options have no effect with --target "
                                   "(nothing is launched)")
        if settings.faults:
            raise click.UsageError("--fault needs a launched stack (not --target)")
        if settings.compare_disagg:
            raise click.UsageError("--compare-disagg needs a launched stack (not --target)")
    elif settings.server_pids:
        raise click.UsageError("--server-pid is for --target runs (a launched stack is sampled "
                               "anyway)")


def _given(param: str) -> bool:
    """Whether the command line gave `param` (not its default)."""
    source = click.get_current_context().get_parameter_source(param)
    return source is click.core.ParameterSource.COMMANDLINE


# ----- the command -----

@click.command()
@options(SweepSettings)
@topology_options
@options(ClientSettings, param="client")
@options(ArrivalSettings, param="arrival")
@options(ShardSettings, param="shard")
@options(RaySettings, param="ray")
@options(TraceSettings, param="trace")
@options(ConversationSettings, param="conversation")
def sweep(settings: SweepSettings, client: ClientSettings, arrival: ArrivalSettings,
          shard: ShardSettings, ray: RaySettings, trace: TraceSettings,
          conversation: ConversationSettings, **topology: Any) -> None:
    """Sweep concurrency levels against the lab's stack (launched here) or a --target.

    Writes results/<run>/: config.json, requests.parquet, levels.csv/json, client.json,
    procs.parquet, plots/*.png, report.md, logs/. Prints the results table and the knee.
    """
    from lab.load.sweep import SweepPlan

    _check_target_mode(settings, topology)
    if arrival.rate and _given("conc"):
        raise click.UsageError("--conc and --rate are alternatives: a level is a concurrency "
                               "(closed loop) or a request rate (open loop)")
    _check_ray(ray, client, shard)
    if trace.trace is not None:
        from lab.commands.trace import check_trace_conflicts

        check_trace_conflicts(arrival, conc_given=_given("conc"))
    if conversation.turns > 1 or _given("think_ms"):
        from lab.commands.trace import check_conversation_conflicts

        check_conversation_conflicts(conversation, settings, arrival, client,
                                     trace=trace.trace is not None)
    if settings.ramp_up and (trace.trace is not None or conversation.turns > 1
                             or ray.ray is not None or shard.shard is not None):
        raise click.UsageError("--ramp-up ramps a closed-loop or rate level of this client: "
                               "not with --trace, --turns, --ray or --shard")
    if client.cancel > 0 and conversation.turns > 1:
        raise click.UsageError("--cancel and --turns are alternatives: a conversation's turns "
                               "are not cancelled")
    target = settings.target
    if shard.shard is not None:
        _check_shard_rate(arrival, trace.trace is not None, conversation.turns > 1)
    if settings.conc == "auto" and (shard.shard is not None or trace.trace is not None):
        raise click.UsageError("--conc auto searches its own levels: not with --shard or "
                               "--trace")
    shard_plan = plan_shard(shard, target=target, concs=settings.conc_levels,
                            requests=settings.requests, seed=settings.seed,
                            rate=bool(arrival.rate))
    concs = settings.conc_levels
    if shard_plan is not None:
        concs = list(shard_plan.levels)
        settings = settings.model_copy(update={"requests": shard_plan.requests,
                                               "seed": shard_plan.seed})
    workload = workload_from_options(
        {**{k: getattr(settings, k) for k in _WORKLOAD_FIELDS},
         "tokenizer": topology.get("tokenizer")}, target=target)
    plan = SweepPlan(
        concurrency=[] if arrival.rate else concs, workload=workload,
        requests=settings.requests, duration_s=settings.duration, warmup=settings.warmup,
        repeat=settings.repeat, client=client,
        rates=arrival.rates, rate_auto=arrival.auto, arrival=arrival.process,
        max_concurrency=arrival.max_concurrency,
        share=shard_plan.share() if shard_plan is not None else None,
        conc_auto=settings.conc == "auto" and not arrival.rate, slos=SLOs(**settings.slos()),
        slo_share=settings.slo_share, max_levels=settings.max_levels,
        ramp_up_s=settings.ramp_up)
    if trace.trace is not None:
        from lab.commands.trace import trace_plan

        plan.trace = trace_plan(trace, workload, settings.requests)
    plan.conversations = conversation.shape()
    name = topology.get("name") or ("target" if target else "lab")
    with _remote_clients(ray, settings.quiet) as remote:
        cap = arrival.max_concurrency
        if remote is not None and cap is not None and cap < remote.streams_for():
            raise click.BadParameter(f"{cap} is below the {remote.streams_for()} Ray client "
                                     "actors it is split over", param_hint="'--max-concurrency'")
        code = _sweep(settings, client, topology, target, name, plan, workload, shard_plan,
                      remote, ray.ray)
    sys.exit(code)


def _sweep(settings: SweepSettings, client: ClientSettings, topology: dict[str, Any],
           target: str | None, name: str, plan: SweepPlan, workload: WorkloadSpec,
           shard_plan: ShardPlan | None, remote: RemoteClients | None,
           ray_address: str | None = None) -> int:
    """Run the sweep the options describe (against --target, both modes, or one stack);
    `ray_address` (--ray): the cluster the topology's Ray-placed processes run on."""
    if target:
        info = target_or_exit(target, topology.get("model"), workload, client.timeout,
                              quiet=settings.quiet)
        plan.workload = replace(workload, include_usage=info.include_usage)
        run_dir = make_dir(name, settings.out)
        if shard_plan is not None:
            # the sweep's modules load before the barrier, not after the agreed start: an
            # import on a loaded node takes hundreds of ms, and would start its shard late
            import uvloop  # noqa: F401

            import lab.load.sweep  # noqa: F401
        plan.start_at_ns = shard_start(run_dir, shard_plan)
        return run_target(run_dir, info.url, info.model, plan, settings, topology.get("name"),
                          info.to_dict(), remote=remote)
    elif settings.compare_disagg:
        specs = [("aggregated", spec_from_options(**{**topology, "disagg": None, "prefill": None,
                                                     "decode": None})),
                 ("disaggregated", spec_from_options(**{**topology, "disagg": True,
                                                        "engines": None}))]
        for _, spec in specs:
            check_faults(settings.faults, spec)
            _check_placement(spec, ray_address)
        run_dir = make_dir(name, settings.out)
        return run_compare_disagg(run_dir, specs, plan, settings, topology.get("name"),
                                  remote=remote, ray_address=ray_address)
    spec = spec_from_options(**topology)
    check_faults(settings.faults, spec)
    _check_placement(spec, ray_address)
    run_dir = make_dir(name, settings.out)
    return run_launched(run_dir, spec, plan, settings, topology.get("name"), remote=remote,
                        ray_address=ray_address)


def _check_placement(spec: TopologySpec, ray_address: str | None) -> None:
    """A topology placing processes on Ray needs --ray (and etcd discovery, no hosts)."""
    from launch.errors import TopologyError

    try:
        spec.check_ray(ray_address)
    except TopologyError as exc:
        raise click.UsageError(str(exc)) from None


def _check_ray(ray: RaySettings, client: ClientSettings, shard: ShardSettings) -> None:
    if ray.ray is None:
        return
    if client.client_procs != 1:
        raise click.UsageError("--client-procs and --ray are alternatives: with --ray the "
                               "client's processes are its actors (--ray-client-nodes)")
    if shard.shard is not None:
        raise click.UsageError("--shard and --ray are alternatives: --ray splits the client "
                               "over the cluster itself")


def _check_shard_rate(arrival: ArrivalSettings, trace: bool, turns: bool) -> None:
    """What --shard cannot split: each shard would search, replay or cap on its own."""
    if arrival.auto:
        raise click.UsageError("--shard with --rate auto: each shard would search its own "
                               "rate; give the rates (--rate R1,R2)")
    if trace:
        raise click.UsageError("--shard and --trace are alternatives (a trace is replayed by "
                               "one client)")
    if turns:
        raise click.UsageError("--shard and --turns are alternatives (conversations run in "
                               "one client)")
    if arrival.rate and arrival.max_concurrency is not None:
        raise click.UsageError("--shard with --max-concurrency: the cap would apply per shard; "
                               "leave it out of a sharded rate run")


@contextlib.contextmanager
def _remote_clients(ray: RaySettings, quiet: bool) -> Iterator[RemoteClients | None]:
    """The sweep's client actors on the Ray cluster (--ray), closed when the sweep ends."""
    if ray.ray is None:
        yield None
        return
    from lab.load.ray_client import RayClientError, RayClientPool

    pool = RayClientPool(ray)
    try:
        pool.start()
    except RayClientError as exc:
        pool.close()
        raise click.ClickException(str(exc)) from None
    try:
        if not quiet:
            for p in pool.placement():
                _echo(f"ray client actor {p['actor']}: node {p['node_id'][:12]} "
                      f"(host {p['host']}, pid {p['pid']})", err=True)
        yield pool
    finally:
        pool.close()


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


def _sweep_config(plan: SweepPlan, settings: SweepSettings, name: str | None, *,
                  target: str | None = None, model: str | None = None,
                  target_check: dict | None = None) -> dict:
    return {
        "name": name,
        "target": target,
        "model": model,
        "target_check": target_check,
        **plan.to_dict(),
        "slos": settings.slos(),
        "knee_threshold": settings.knee_threshold,
        "faults": [str(f) for f in settings.faults],
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


async def _inject(stack: Stack, faults: tuple[FaultSpec, ...], t0: float,
                  progress: LineProgress) -> None:
    for f in faults:
        delay = t0 + f.at_s - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        try:
            what = await stack.fault(f.process, f.kind)
            progress.done(f"fault injected at {f.at_s:g} s: {what}")
        except Exception as exc:  # a failed injection must not stop the sweep
            progress.done(f"fault {f} could not be injected: {exc}")


def _event_printer(progress: LineProgress) -> Any:
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


async def _launched(run_dir: Path, spec: TopologySpec, plan: SweepPlan,
                    faults: tuple[FaultSpec, ...], quiet: bool,
                    remote: RemoteClients | None = None, ray_address: str | None = None) -> None:
    from lab.load.sweep import LineProgress, SweepRunner
    from launch.stack import Stack

    await _main_task_guard()
    progress = LineProgress(quiet=quiet)
    if not quiet:
        _echo(f"launching {spec.name}: " + ", ".join(
            f"{f.count}x {f.role}" for f in spec.fleets) + f" -> {run_dir}", err=True)
    async with Stack(spec, run_dir, ray_address=ray_address) as stack:
        if not quiet:
            _echo(f"stack ready: {stack.frontend_url} (model {stack.model})", err=True)
            for agent in stack.ray_fleet.describe() if stack.ray_fleet is not None else ():
                _echo(f"ray agent {agent['agent']}: node {str(agent.get('node_id'))[:12]} "
                      f"(pid {agent.get('pid')}): {', '.join(agent['processes'])}", err=True)
            stack.on_event(_event_printer(progress))
        after_level = None
        if plan.client.cancels() is not None:  # --cancel: did every process let go?
            from lab.sweep.leak_check import LeakCheck, after_level_check

            leaks = LeakCheck(stack.processes, stack.frontend_url, stack.discovery)
            await leaks.baseline()
            after_level = after_level_check(leaks, run_dir, progress.done)
        runner = SweepRunner(run_dir, stack.frontend_url, stack.model, plan, progress=progress,
                             procs_samples=stack.cpu_samples, remote=remote,
                             after_level=after_level)
        t0 = time.monotonic()
        failed: RuntimeError | None = None
        async with asyncio.TaskGroup() as tg:
            injector = tg.create_task(_inject(stack, faults, t0, progress)) if faults else None
            try:
                await runner.run()
            except RuntimeError as exc:  # a failed level, a leak: raised below, not as a group
                failed = exc
            if injector is not None and not injector.done():
                pending = [str(f) for f in faults if t0 + f.at_s > time.monotonic()]
                progress.done(f"warning: the sweep ended before these faults fired: "
                              f"{', '.join(pending)}")
                injector.cancel()
        if failed is not None:
            raise failed


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


def run_launched(run_dir: Path, spec: TopologySpec, plan: SweepPlan, settings: SweepSettings,
                 name: str | None, title: str | None = None,
                 remote: RemoteClients | None = None, ray_address: str | None = None) -> int:
    """`name`: the --name given (None: not given), as the sweep's config records it."""
    from launch.config import write_config

    write_config(run_dir, spec, extra={"sweep": _sweep_config(plan, settings, name)})
    code = _run(lambda: _launched(run_dir, spec, plan, settings.faults, settings.quiet, remote,
                                  ray_address))
    _print_results(run_dir, title, make_plots=not settings.no_plots)
    return code


async def _targeted(run_dir: Path, target: str, model: str, plan: SweepPlan, quiet: bool,
                    server_pids: dict[str, int], remote: RemoteClients | None = None) -> None:
    from lab.load.sweep import LineProgress, SweepRunner
    from lab.sweep.leak_check import target_note
    from lab.sweep.server_sampling import sampling_servers

    await _main_task_guard()
    progress = LineProgress(quiet=quiet)
    after_level = target_note(progress.done) if plan.client.cancels() is not None else None
    async with sampling_servers(run_dir, server_pids) as samples:
        runner = SweepRunner(run_dir, target, model, plan, progress=progress,
                             procs_samples=samples, remote=remote, after_level=after_level)
        await runner.run()


def run_target(run_dir: Path, target: str, model: str, plan: SweepPlan, settings: SweepSettings,
               name: str | None, target_check: dict | None = None,
               remote: RemoteClients | None = None) -> int:
    from launch.config import write_config

    write_config(run_dir, extra={"sweep": _sweep_config(plan, settings, name, target=target,
                                                        model=model, target_check=target_check)})
    code = _run(lambda: _targeted(run_dir, target, model, plan, settings.quiet,
                                  settings.server_pids, remote))
    _print_results(run_dir, make_plots=not settings.no_plots)
    return code


def run_compare_disagg(run_dir: Path, specs: list[tuple[str, TopologySpec]], plan: SweepPlan,
                       settings: SweepSettings, name: str | None,
                       remote: RemoteClients | None = None,
                       ray_address: str | None = None) -> int:
    """Both topologies into run_dir/<mode>/, then the comparison into run_dir/compare/."""
    from lab.report.comparison import compare_runs

    dirs = []
    for mode, spec in specs:
        sub = run_dir / mode
        sub.mkdir()
        spec.name = f"{spec.name}-{mode}"
        code = run_launched(sub, spec, plan, settings, name, title=mode, remote=remote,
                            ray_address=ray_address)
        if code != 0:
            return code
        dirs.append(sub)
    _echo()
    result = compare_runs(dirs, run_dir / "compare", make_plots=not settings.no_plots)
    _echo(result.terminal)
    return 0
