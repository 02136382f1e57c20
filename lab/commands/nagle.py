"""`lab nagle`: the idle-connection Nagle / delayed-ACK probe.

On the launched stack, each arm is one SocketSettings (one aggregated stack per arm, torn down
between arms), driven with the same requests at concurrency 1 on a persistent connection and at
concurrency `--many`. With `--target URL --model NAME` nothing is launched: the arms become
traffic shapes against that server (reused vs fresh connections, idle gaps, continuous traffic,
streaming vs not).

This module is the command line only. The arms and options: lab.commands.nagle_arms; running
them: lab.commands.nagle_run; the run directory and --reanalyse: lab.commands.nagle_report.
Statistics: lab.analysis.nagle; the verdict as data: lab.analysis.nagle_verdict, in words:
lab.analysis.nagle_words; plots: lab.report.nagle_plots.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import click

from lab.analysis.nagle import DEFAULT_THRESHOLD_MS, MIN_SAMPLES
from lab.analysis.nagle_verdict import Verdict
from lab.commands.nagle_arms import (
    DEFAULT_ARMS,
    DEFAULT_EXTERNAL_GAP_MS,
    DEFAULT_MANY,
    DEFAULT_REQUESTS,
    EXTERNAL_ARMS,
    LAUNCHED_ARMS,
    ProbeOptions,
    csv_list,
    external_arms,
    launched_arms,
    parse_gaps,
)
from lab.commands.nagle_report import reanalyse, write_config, write_outputs
from lab.commands.nagle_run import launched_or_fail, progress, run_external
from lab.commands.sweep_settings import (
    MAX_CONCURRENCY,
    MAX_REQUESTS,
    MAX_SEQUENCE_TOKENS,
)
from lab.commands.target import prompt_form_options, target_or_exit, workload_from_options
from lab.load.workload import WorkloadSpec
from lab.shared.config_cli import MAX_SECONDS, MAX_SEED, FiniteFloatRange
from lab.shared.settings import DEFAULT_MODEL
from launch.topology import DEFAULT_SPEEDUP


def _run_dir(out: Path | None) -> Path:
    """results/<timestamp>-nagle, or --out DIR (which must be empty), like a sweep's."""
    from launch.errors import RunError
    from launch.rundir import make_run_dir

    try:
        return make_run_dir("nagle", out)
    except RunError as exc:
        raise click.BadParameter(str(exc), param_hint="--out") from exc



@click.command(name="nagle")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Run directory. [default: results/<timestamp>-nagle]")
@click.option("--requests", "n_requests", type=click.IntRange(1, MAX_REQUESTS),
              default=DEFAULT_REQUESTS, show_default=True,
              help="Requests per arm and concurrency level.")
@click.option("--arms", default=None,
              help="Comma-separated arms, or 'all'. Launched stack: "
              + ", ".join(LAUNCHED_ARMS)
              + " [default: control,suspect]. With --target: "
              + ", ".join(EXTERNAL_ARMS)
              + " (reused always runs) [default: all].")
@click.option("--gap-ms", default=None,
              help="Idle gaps between requests, ms, comma-separated: each value > 0 adds an arm "
              "at concurrency 1 (suspect settings on the launched stack, one reused connection "
              f"with --target). [default: 0; with --target {DEFAULT_EXTERNAL_GAP_MS:g}]")
@click.option("--many", type=click.IntRange(2, MAX_CONCURRENCY), default=DEFAULT_MANY,
              show_default=True,
              help="The continuous-traffic concurrency level run beside concurrency 1.")
@click.option("--threshold-ms", type=FiniteFloatRange(min=0, min_open=True,
                                                    max=MAX_SECONDS * 1000),
              default=DEFAULT_THRESHOLD_MS, show_default=True,
              help="A stall: TTFT at least this far above the fastest decile.")
@click.option("--speedup", type=FiniteFloatRange(min=0), default=DEFAULT_SPEEDUP,
              show_default=True,
              help="Engine speedup of the launched stack (1000: the engine is nearly free).")
@click.option("--isl", type=click.IntRange(1, MAX_SEQUENCE_TOKENS), default=WorkloadSpec.isl,
              show_default=True,
              help="Prompt tokens per request (exact in --tokenizer's tokenizer when given).")
@click.option("--osl", type=click.IntRange(1, MAX_SEQUENCE_TOKENS), default=WorkloadSpec.osl,
              show_default=True,
              help="Output tokens per request.")
@click.option("--seed", type=click.IntRange(0, MAX_SEED), default=0, show_default=True,
              help="Workload seed.")
@click.option("--warmup", type=click.IntRange(0, MAX_REQUESTS), default=0, show_default=True,
              help="Leading requests per level left out of the statistics (0: the first request "
              "of a fresh connection is part of the signature).")
@click.option("--timeout", "timeout_s",
              type=FiniteFloatRange(min=0, min_open=True, max=MAX_SECONDS), default=60.0,
              show_default=True, help="Per-request timeout, seconds.")
@prompt_form_options
@click.option("--tokenizer", default=None, metavar="PATH",
              help="A HuggingFace tokenizer.json or local model directory (no hub access): "
              "prompts of exactly --isl tokens in it; the launched stack's frontend tokenizes "
              "with it too.  [default: none: the lab frontend's word tokenizer]")
@click.option("--target", default=None,
              help="Base URL of a running OpenAI-compatible server (e.g. http://127.0.0.1:8000): "
              "nothing is launched and the arms become traffic shapes. One probe request "
              "checks it first.")
@click.option("--model", default=None,
              help="Model name. With --target: the server's only model when /v1/models lists "
              f"one, else required. [default: {DEFAULT_MODEL}]")
@click.option("--topology", "topology", default=None,
              type=click.Path(path_type=Path, dir_okay=False, exists=True),
              help="Launch each arm on this TOML topology (e.g. fleets on network hosts, see "
              "launch/topology.py) instead of one aggregated engine; each arm changes only the "
              "socket settings. --speedup is then the file's.")
@click.option("--reanalyse", "reanalyse_dir", default=None,
              type=click.Path(path_type=Path, file_okay=False, exists=True),
              help="Send nothing: recompute nagle.json, plots and report.md of an earlier "
              "probe's run directory from its requests.parquet (with --threshold-ms if given).")
def nagle(
    out: Path | None,
    n_requests: int,
    arms: str | None,
    gap_ms: str | None,
    many: int,
    threshold_ms: float,
    speedup: float,
    isl: int,
    osl: int,
    seed: int,
    warmup: int,
    timeout_s: float,
    target: str | None,
    model: str | None,
    topology: Path | None,
    reanalyse_dir: Path | None,
    prompt_kind: str | None,
    endpoint: str,
    tokenizer: str | None,
) -> None:
    """Probe the idle-connection Nagle / delayed-ACK stall and give a verdict with numbers.

    Launched stack (default): one aggregated stack per arm, each arm changing one socket
    setting (control: NODELAY on, coalesced writes; suspect: client NODELAY off and split
    writes); the same requests at concurrency 1 and at --many.

    With --target URL --model NAME: nothing is launched; the arms are traffic shapes (one reused
    connection, a fresh connection per request, idle gaps, concurrency --many, non-streaming).
    """
    if reanalyse_dir is not None:
        ctx = click.get_current_context()
        source = ctx.get_parameter_source("threshold_ms")
        explicit = source == click.core.ParameterSource.COMMANDLINE
        _finish(*reanalyse(reanalyse_dir, threshold_ms if explicit else None), reanalyse_dir)
        return
    external = target is not None
    if warmup >= n_requests:
        raise click.BadParameter(f"{warmup} must be below --requests ({n_requests})",
                                 param_hint="--warmup")
    gaps = parse_gaps(gap_ms if gap_ms is not None else
                      (f"{DEFAULT_EXTERNAL_GAP_MS:g}" if external else "0"))
    names = csv_list(arms) if arms else (["all"] if external else list(DEFAULT_ARMS))
    if not names:
        raise click.BadParameter("no arm given", param_hint="--arms")
    selected = external_arms(names, gaps, many) if external else launched_arms(names, gaps, many)
    if not external and n_requests - warmup < MIN_SAMPLES:
        progress(f"note: fewer than {MIN_SAMPLES} measured requests per level: no verdict possible")
    workload = workload_from_options(
        {"isl": isl, "osl": osl, "seed": seed, "prompt_kind": prompt_kind, "endpoint": endpoint,
         "tokenizer": tokenizer}, target=target)
    opts = ProbeOptions(
        requests=n_requests, many=many, threshold_ms=threshold_ms, speedup=speedup, isl=isl,
        osl=osl, seed=seed, warmup=warmup, timeout_s=timeout_s, model=model or DEFAULT_MODEL,
        target=target.rstrip("/") if target else None,
        topology=str(topology) if topology else None,
        prompt_kind=workload.prompt_kind, endpoint=workload.endpoint,
        tokenizer=workload.tokenizer,
    )
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
        info = target_or_exit(target, model, workload, timeout_s)
        opts.target, opts.model, opts.include_usage = info.url, info.model, info.include_usage
        target_check = info.to_dict()
    out = _run_dir(out)
    write_config(out, {
        "mode": "external" if external else "launched",
        **asdict(opts),
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
