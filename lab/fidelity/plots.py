"""plots/fidelity.png: each compared metric against concurrency, one line per side."""

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
        for name, levels in sides:
            if column in levels:
                ax.plot(levels["concurrency"], levels[column], "o-", label=name)
        ax.set(title=label, xlabel="concurrency", ylabel=label, xscale="log")
        ax.legend(fontsize=8)
    fig.suptitle(title)
    return _save(fig, path)
