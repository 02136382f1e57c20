"""The token path side by side: `lab sweep` of the launched stack at two commits and of Dynamo
1.6.1's frontend and CPU mocker, in alternating rounds, on the README's headline workload.

    python -m tests.bench.token_path --anchors DIR --tree new=. --tree old=/path/to/old/checkout \
        --rounds 3 --out /tmp/token-path

Each round runs Dynamo (the anchors' `dynamo.sh up agg --speedup 1000`, fresh each round, swept
with --target and its pids sampled), then each --tree's launched stack (its `lab` on
PYTHONPATH=TREE), with the round's seed. Prints per level and side the median req/s with its
range, TTFT p50, ITL p50 and server CPU per token, and each tree's req/s against Dynamo's and
against the first tree's. Every process it starts is stopped, also on Ctrl-C.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path

import click
import pandas as pd

DYNAMO_MODEL = "mock-llama"
FIGURES = ("req_s", "ttft_ms_p50", "itl_ms_p50", "server_cpu_us_per_token")


def _lab(tree: Path, args: list[str]) -> None:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run([sys.executable, "-m", "lab", "sweep", *args], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise click.ClickException(f"lab sweep failed ({tree}):\n{proc.stderr[-3000:]}")


def _dynamo(anchors: Path, *words: str) -> str:
    proc = subprocess.run([str(anchors / "dynamo.sh"), *words], capture_output=True, text=True)
    if proc.returncode != 0:
        raise click.ClickException(f"dynamo.sh {' '.join(words)} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout.strip()


def _levels(run: Path) -> pd.DataFrame:
    return pd.read_csv(run / "levels.csv").set_index("concurrency")


@click.command()
@click.option("--anchors", type=click.Path(exists=True, file_okay=False, path_type=Path),
              required=True, help="The anchors' scripts folder (dynamo.sh).")
@click.option("--tree", "trees", multiple=True, required=True, metavar="NAME=DIR",
              help="A checkout of the lab to sweep (its launched stack), repeatable; the first "
              "is the one the others are compared with.")
@click.option("--rounds", type=click.IntRange(1, 100), default=3, show_default=True)
@click.option("--conc", default="1,32,128,256", show_default=True)
@click.option("--requests", type=click.IntRange(1), default=800, show_default=True)
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="A new folder for the run directories.")
def main(anchors: Path, trees: tuple[str, ...], rounds: int, conc: str, requests: int,
         out: Path) -> None:
    """Alternating rounds of Dynamo and each tree; medians per level and side."""
    sides = {}
    for item in trees:
        name, _, path = item.partition("=")
        if not name or not path or not Path(path).is_dir():
            raise click.BadParameter(f"{item!r}: expected NAME=DIR", param_hint="'--tree'")
        sides[name] = Path(path).resolve()
    out.mkdir(parents=True, exist_ok=False)
    tokenizer = Path(os.environ.get("ANCHOR_DIR", Path.home() / ".cache/lab-anchors")) / "model"
    common = ["--tokenizer", str(tokenizer), "--prompt-kind", "text", "--endpoint",
              "completions", "--isl", "136", "--osl", "128", "--requests", str(requests),
              "--conc", conc, "--quiet", "--no-plots"]
    runs: dict[str, list[Path]] = {"dynamo": [], **{n: [] for n in sides}}
    try:
        for r in range(1, rounds + 1):
            seed = str(900 + r)
            click.echo(f"round {r}/{rounds}: dynamo", err=True)
            _dynamo(anchors, "up", "agg", "--speedup", "1000")
            try:
                pids = _dynamo(anchors, "pids").split()
                run = out / f"r{r}-dynamo"
                flags = [w for p in pids for w in ("--server-pid", p)]
                _lab(next(iter(sides.values())),
                     [*common, "--target", "http://127.0.0.1:8787", "--model", DYNAMO_MODEL,
                      "--seed", seed, *flags, "--out", str(run)])
                runs["dynamo"].append(run)
            finally:
                _dynamo(anchors, "down")
            for name, tree in sides.items():
                click.echo(f"round {r}/{rounds}: {name}", err=True)
                run = out / f"r{r}-{name}"
                _lab(tree, [*common, "--model", DYNAMO_MODEL, "--seed", seed, "--out", str(run)])
                runs[name].append(run)
    except KeyboardInterrupt:
        _dynamo(anchors, "down")
        raise SystemExit(130) from None
    _print(runs, list(sides))


def _print(runs: dict[str, list[Path]], trees: list[str]) -> None:
    tables = {side: [_levels(r) for r in rs] for side, rs in runs.items() if rs}
    levels = sorted(set().union(*(t[0].index for t in tables.values())))
    click.echo("| c | side | req/s [range] | TTFT p50 ms | ITL p50 ms | server CPU us/token |")
    click.echo("|---|---|---|---|---|---|")
    med: dict[tuple[str, int], float] = {}
    for c in levels:
        for side, tabs in tables.items():
            vals = {f: [float(t.loc[c, f]) for t in tabs if c in t.index and f in t.columns]
                    for f in FIGURES}
            rs = vals["req_s"]
            med[side, c] = statistics.median(rs)
            click.echo(f"| {c} | {side} | {med[side, c]:.1f} [{min(rs):.0f}-{max(rs):.0f}] | "
                       + " | ".join(f"{statistics.median(vals[f]):.3g}" if vals[f] else "-"
                                    for f in FIGURES[1:]) + " |")
    for tree in trees:
        vs_dyn = " / ".join(f"{med[tree, c] / med['dynamo', c]:.2f}" for c in levels)
        click.echo(f"{tree} vs dynamo req/s: {vs_dyn}")
        if tree != trees[0]:
            vs_first = " / ".join(f"{med[tree, c] / med[trees[0], c]:.2f}" for c in levels)
            click.echo(f"{tree} vs {trees[0]} req/s: {vs_first}")


if __name__ == "__main__":
    main()
