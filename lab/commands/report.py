"""`lab report RUN`: rebuild levels.csv/json, plots and report.md from requests.parquet
(+ procs.parquet, client.json, config.json and events.jsonl when present)."""

from __future__ import annotations

import click

from lab.sweep.run_options import option_of
from lab.sweep.sweep_settings import SweepSettings


@click.command()
@click.argument("run")
@option_of(SweepSettings, "no_plots")
@option_of(SweepSettings, "knee_threshold", default=None, show_default=False,
           help="Marginal-efficiency threshold of the knee rule.  [default: the run's, or 0.1]")
def report(run: str, no_plots: bool, knee_threshold: float | None) -> None:
    """Re-analyse RUN (a run directory, or a run name under results/)."""
    from lab.analysis.rundir import REQUESTS
    from lab.report.build import build_run, summary_lines
    from lab.report.markdown import client_sentence, results_table
    from lab.report.turns import turns_table
    from launch.errors import RunError
    from launch.rundir import resolve_run

    try:
        path = resolve_run(run)
    except RunError as exc:
        raise click.BadParameter(str(exc), param_hint="'RUN'") from None
    if not (path / REQUESTS).exists():
        raise click.BadParameter(f"{path} has no {REQUESTS} (not a sweep run, or no level "
                                 "completed)", param_hint="'RUN'")
    analysis = build_run(path, make_plots=not no_plots, knee_threshold=knee_threshold)
    click.echo(results_table(analysis.table))
    click.echo()
    for line in summary_lines(analysis):
        click.echo(line)
    click.echo(client_sentence(analysis.table))
    if not analysis.turns.empty:
        click.echo("\nper turn:\n" + turns_table(analysis.turns))
    click.echo(f"wrote {path / 'levels.csv'}, {path / 'levels.json'}, {path / 'report.md'}"
               + ("" if no_plots else f" and {len(analysis.plots)} plots in {path / 'plots'}"))
