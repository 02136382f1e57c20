"""`lab compare RUN_A RUN_B [...]`: one table aligned by level (concurrency, offered rate, or
the trace replay) with deltas (%) against RUN_A, each run's load shape, a sentence per run, a
warning when their loads differ beside the levels (a usage error when their shapes cannot be
compared at all), and overlay plots (into --out, or RUN_A/compare/)."""

from __future__ import annotations

from pathlib import Path

import click

from lab.sweep.run_options import option_of
from lab.sweep.sweep_settings import SweepSettings


@click.command()
@click.argument("runs", nargs=-1, required=True)
@option_of(SweepSettings, "out", type=click.Path(file_okay=False, path_type=Path),
           help="Where compare.md, compare.html, compare.csv and the plots go.  "
           "[default: RUN_A/compare/]")
@option_of(SweepSettings, "no_plots")
def compare(runs: tuple[str, ...], out: Path | None, no_plots: bool) -> None:
    """Compare sweep runs (run directories or run names under results/), the first as baseline."""
    from lab.analysis.rundir import REQUESTS
    from lab.report.comparison import compare_runs
    from lab.report.shape_check import ShapeMismatch
    from launch.errors import RunError
    from launch.rundir import resolve_run

    if len(runs) < 2:
        raise click.UsageError("give at least two runs: lab compare RUN_A RUN_B [...]")
    paths = []
    for run in runs:
        try:
            path = resolve_run(run)
        except RunError as exc:
            raise click.BadParameter(str(exc), param_hint=f"'RUN' ({run})") from None
        if not (path / REQUESTS).exists():
            raise click.BadParameter(f"{path} has no {REQUESTS}", param_hint=f"'RUN' ({run})")
        paths.append(path)
    try:
        result = compare_runs(paths, out or paths[0] / "compare", make_plots=not no_plots)
    except ShapeMismatch as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(result.terminal)
    click.echo(f"\nwrote {result.out_dir / 'compare.md'}, {result.out_dir / 'compare.html'}"
               + (f" and {len(result.plots)} plots" if result.plots else ""))
