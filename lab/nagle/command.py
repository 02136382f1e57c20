"""`lab nagle`: the idle-connection Nagle / delayed-ACK probe.

On the launched stack, each arm is one SocketSettings (one aggregated stack per arm, torn down
between arms), driven with the same requests at concurrency 1 on a persistent connection and at
concurrency `--many`. With `--target URL --model NAME` nothing is launched: the arms become
traffic shapes against that server (reused vs fresh connections, idle gaps, continuous traffic,
streaming vs not).

This module is the command line only. The arms and options: lab.nagle.arms; running
them: lab.nagle.run; the run directory and --reanalyse: lab.nagle.report.
Statistics: lab.nagle.stats; the verdict as data: lab.nagle.verdict, in words:
lab.nagle.words; plots: lab.nagle.plots.
"""

from __future__ import annotations

from pathlib import Path

import click

from lab.nagle.arms import (
    DEFAULT_ARMS,
    DEFAULT_EXTERNAL_GAP_MS,
    csv_list,
    external_arms,
    launched_arms,
    parse_gaps,
)
from lab.nagle.report import reanalyse, write_config, write_outputs
from lab.nagle.run import launched_or_fail, progress, run_external
from lab.nagle.settings import NagleSettings
from lab.nagle.stats import MIN_SAMPLES
from lab.nagle.verdict import Verdict
from lab.shared.config_cli import options
from lab.shared.settings import DEFAULT_MODEL
from lab.sweep.target import target_or_exit, workload_from_options


def _run_dir(out: Path | None) -> Path:
    """results/<timestamp>-nagle, or --out DIR (which must be empty), like a sweep's."""
    from launch.errors import RunError
    from launch.rundir import make_run_dir

    try:
        return make_run_dir("nagle", out)
    except RunError as exc:
        raise click.BadParameter(str(exc), param_hint="--out") from exc



@click.command(name="nagle")
@options(NagleSettings)
def nagle(settings: NagleSettings) -> None:
    """Probe the idle-connection Nagle / delayed-ACK stall and give a verdict with numbers.

    Launched stack (default): one aggregated stack per arm, each arm changing one socket
    setting (control: NODELAY on, coalesced writes; suspect: client NODELAY off and split
    writes); the same requests at concurrency 1 and at --many.

    With --target URL --model NAME: nothing is launched; the arms are traffic shapes (one reused
    connection, a fresh connection per request, idle gaps, concurrency --many, non-streaming).
    """
    if settings.reanalyse_dir is not None:
        ctx = click.get_current_context()
        source = ctx.get_parameter_source("threshold_ms")
        explicit = source == click.core.ParameterSource.COMMANDLINE
        _finish(*reanalyse(settings.reanalyse_dir, settings.threshold_ms if explicit else None),
                settings.reanalyse_dir)
        return
    target, topology, model = settings.target, settings.topology, settings.model
    external = target is not None
    gap_ms = settings.gap_ms
    gaps = parse_gaps(gap_ms if gap_ms is not None else
                      (f"{DEFAULT_EXTERNAL_GAP_MS:g}" if external else "0"))
    names = csv_list(settings.arms) if settings.arms else (
        ["all"] if external else list(DEFAULT_ARMS))
    if not names:
        raise click.BadParameter("no arm given", param_hint="--arms")
    many = settings.many
    selected = external_arms(names, gaps, many) if external else launched_arms(names, gaps, many)
    if not external and settings.requests - settings.warmup < MIN_SAMPLES:
        progress(f"note: fewer than {MIN_SAMPLES} measured requests per level: no verdict possible")
    workload = workload_from_options(
        {k: getattr(settings, k) for k in ("isl", "osl", "seed", "prompt_kind", "endpoint",
                                           "tokenizer")}, target=target)
    opts = settings.model_copy(update=dict(
        model=model or DEFAULT_MODEL, target=target.rstrip("/") if target else None,
        prompt_kind=workload.prompt_kind, endpoint=workload.endpoint,
        tokenizer=workload.tokenizer))
    if topology is not None and external:
        raise click.UsageError("--topology launches a stack; it cannot be combined with --target")
    if topology is not None:
        from launch.errors import TopologyError
        from launch.topology import TopologySpec

        try:
            TopologySpec.from_toml(topology)
        except (TopologyError, ValueError) as exc:
            raise click.BadParameter(str(exc), param_hint="--topology") from exc
    import uvloop

    target_check = None
    if external:
        assert target is not None
        info = target_or_exit(target, model, workload, settings.timeout_s)
        opts = opts.model_copy(update=dict(target=info.url, model=info.model,
                                           include_usage=info.include_usage))
        target_check = info.to_dict()
    out = _run_dir(settings.out)
    write_config(out, {
        "mode": "external" if external else "launched",
        **opts.model_dump(mode="json"),
        "arms": [a.to_dict() for a in selected],
        "target_check": target_check,
    })
    if external:
        records = uvloop.run(run_external(selected, opts))
    else:
        records = uvloop.run(launched_or_fail(selected, opts, out))
    _, verdict, table = write_outputs(out, records, selected, opts, external=external)
    _finish(table, verdict, out)


def _finish(table: str, verdict: Verdict, out: Path) -> None:
    click.echo(table)
    click.echo("")
    click.echo(verdict.text)
    for line in verdict.lines:
        click.echo(f"  {line}")
    click.echo(f"\nrun directory: {out}")
