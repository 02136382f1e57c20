"""Plots of a Nagle probe: TTFT CDFs of every arm overlaid, and one TTFT histogram per arm."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

LINESTYLES = ("-", "--", ":", "-.")


def _clean(values: Sequence[float]) -> np.ndarray:
    x = np.asarray([v for v in values if v is not None], dtype=float)
    return np.sort(x[~np.isnan(x)])


def ttft_cdf(
    samples: Mapping[str, Mapping[int, Sequence[float]]],
    path: Path,
    *,
    floor_ms: float | None = None,
    title: str = "TTFT CDF per arm",
) -> Path:
    """All arms overlaid on a log axis; one line style per concurrency level, one colour per arm.

    `floor_ms`: the stall cluster's floor at concurrency 1 (drawn as a dotted line).
    """
    fig, ax = plt.subplots(figsize=(9, 5.5))
    levels = sorted({c for lv in samples.values() for c in lv})
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    lows: list[float] = []
    for i, (arm, lv) in enumerate(samples.items()):
        color = colors[i % len(colors)]
        for conc, vals in sorted(lv.items()):
            x = _clean(vals)
            if x.size == 0:
                continue
            lows.append(float(x[0]))
            y = np.arange(1, x.size + 1) / x.size
            style = LINESTYLES[levels.index(conc) % len(LINESTYLES)]
            ax.step(x, y, where="post", color=color, linestyle=style, label=f"{arm}, c={conc}")
    lo = min((v for v in lows if v > 0), default=0.1)
    if floor_ms is not None and floor_ms > 0:
        ax.axvline(floor_ms, color="grey", linestyle=":", linewidth=1)
        ax.text(floor_ms, 0.5, " stall-cluster floor (c=1)", color="grey", fontsize=8,
                rotation=90, va="center")
    ax.set_xscale("log")
    ax.set_xlim(left=lo * 0.8)
    ax.set_xlabel("TTFT (ms, log)")
    ax.set_ylabel("share of requests")
    ax.set_ylim(0, 1.01)
    ax.grid(True, alpha=0.3)
    ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def ttft_histograms(
    samples: Mapping[str, Mapping[int, Sequence[float]]],
    path: Path,
    *,
    bin_ms: float = 1.0,
) -> Path:
    """One panel per arm, the levels overlaid; 1 ms bins up to the largest sample (capped)."""
    arms = list(samples)
    allx = np.concatenate([_clean(v) for lv in samples.values() for v in lv.values()]
                          or [np.zeros(1)])
    top = float(np.percentile(allx, 99.5)) if allx.size else 1.0
    top = max(top * 1.05, 5.0)
    bins = np.arange(0.0, top + bin_ms, max(bin_ms, top / 200))
    fig, axes = plt.subplots(len(arms), 1, figsize=(9, 2.2 * len(arms) + 0.6), sharex=True)
    axes = np.atleast_1d(axes)
    for ax, arm in zip(axes, arms, strict=True):
        for conc, vals in sorted(samples[arm].items()):
            x = _clean(vals)
            if x.size:
                ax.hist(np.clip(x, 0, top), bins=bins, alpha=0.6, label=f"c={conc} (n={x.size})")
        ax.set_title(arm, fontsize=9, loc="left")
        ax.set_ylabel("requests")
        ax.legend(fontsize=8)
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("TTFT (ms; the last bin holds everything above the 99.5th percentile)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
