"""plots/fidelity.png: each compared metric against concurrency (or offered rate, open loop),
one line per side."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from lab.fidelity.gaps import METRICS
from lab.report.plots import _save


def fidelity_plot(sides: list[tuple[str, pd.DataFrame]], path: Path, title: str) -> Path:
    fig, axes = plt.subplots(1, len(METRICS), figsize=(4 * len(METRICS), 4))
    for ax, (column, label) in zip(axes, METRICS, strict=True):
        xlabel = "concurrency"
        for name, levels in sides:
            if column not in levels:
                continue
            rates = levels["rate"] if "rate" in levels else pd.Series(float("nan"),
                                                                        index=levels.index)
            open_loop = rates.notna()
            closed = levels[~open_loop]
            if len(closed):
                ax.plot(closed["concurrency"], closed[column], "o-", label=name)
            if open_loop.any():
                rated = levels[open_loop].sort_values("rate")
                ax.plot(rated["rate"], rated[column], "s--", label=f"{name} (open loop)")
                xlabel = "offered req/s" if not len(closed) else "concurrency / offered req/s"
        ax.set(title=label, xlabel=xlabel, ylabel=label, xscale="log")
        ax.legend(fontsize=8)
    fig.suptitle(title)
    return _save(fig, path)
