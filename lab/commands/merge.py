"""`lab merge SHARD_DIR... --out DIR`: one run directory and report from sharded client runs."""

from __future__ import annotations

from pathlib import Path

import click

from lab.sweep.run_options import option_of
from lab.sweep.sweep_settings import SweepSettings


@click.command()
@click.argument("shard_dirs", nargs=-1, required=True,
                type=click.Path(file_okay=False, exists=True, path_type=Path))
@option_of(SweepSettings, "out", type=click.Path(file_okay=False, path_type=Path),
           required=True, help="The merged run directory (must not exist or be empty).")
@option_of(SweepSettings, "no_plots")
def merge(shard_dirs: tuple[Path, ...], out: Path, no_plots: bool) -> None:
    """Join the run directories of `lab sweep --shard I/N` (all N shards) into one: requests
    on one wall clock, each level the sum of its shards, levels, plots and report.md."""
    from lab.analysis.shards import ShardError
    from lab.analysis.shards import merge as merge_shards
    from lab.commands.sweep import _print_results

    if out.exists() and any(out.iterdir()):
        raise click.BadParameter(f"{out} is not empty", param_hint="'--out'")
    try:
        count = merge_shards(list(shard_dirs), out)
    except ShardError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(f"merged {count} shards -> {out}", err=True)
    _print_results(out, make_plots=not no_plots)
