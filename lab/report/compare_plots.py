"""`lab compare`'s overlays of open-loop runs: per offered rate (rate sweeps), and per second
over the replay (trace runs, whose one level each has no axis to plot along)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from lab.report.plots import _save, legend_outside


def compare_rates(runs: list[tuple[str, pd.DataFrame]], path: Path) -> Path:
    """Per run, against the offered rate: the sent and completed rates (the diagonal is
    'kept up'), and TTFT p50 and p99 from the intended send (corrected)."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 7), sharex=True)
    top_rate = 0.0
    for i, (label, levels) in enumerate(runs):
        lv = levels[levels["rate"].notna()].sort_values("rate")
        color = f"C{i}"
        top.plot(lv["rate"], lv["sent_req_s"], "o-", color=color, label=f"{label}: sent")
        top.plot(lv["rate"], lv["completed_req_s"], "s--", color=color,
                 label=f"{label}: completed")
        bottom.plot(lv["rate"], lv["ttft_intended_ms_p50"], "o-", color=color,
                    label=f"{label}: TTFT p50 (intended)")
        bottom.plot(lv["rate"], lv["ttft_intended_ms_p99"], "s--", color=color,
                    label=f"{label}: TTFT p99 (intended)")
        top_rate = max(top_rate, float(lv["rate"].max()) if len(lv) else 0.0)
    top.plot([0, top_rate], [0, top_rate], ":", color="grey", label="offered")
    return _finish(fig, top, bottom, path,
                   "Open loop, runs compared: achieved rate and TTFT vs offered rate",
                   "TTFT from the intended send (ms)", "offered rate (requests/s)")


def _finish(fig: plt.Figure, top: plt.Axes, bottom: plt.Axes, path: Path, title: str,
            bottom_label: str, x_label: str) -> Path:
    """Both compare overlays: requests/s above, TTFT below, one x axis."""
    top.set_ylabel("requests/s")
    top.set_title(title)
    bottom.set_ylabel(bottom_label)
    bottom.set_xlabel(x_label)
    for ax in (top, bottom):
        ax.grid(True, alpha=0.3)
        legend_outside(ax, fontsize=7)
    return _save(fig, path)


def compare_timelines(runs: list[tuple[str, pd.DataFrame]], path: Path) -> Path:
    """Per run (its timeline.parquet rows), per second since its replay's first request:
    sent and completed req/s, and TTFT p99 of the requests sent in the second."""
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for i, (label, timeline) in enumerate(runs):
        tl = timeline.sort_values("t_s")
        x = tl["t_s"] - tl["t_s"].min() + 0.5  # the middle of each one-second bin
        color = f"C{i}"
        top.plot(x, tl["sent"], "-", color=color, label=f"{label}: sent/s")
        top.plot(x, tl["completed"], "--", color=color, label=f"{label}: completed/s")
        bottom.plot(x, tl["ttft_ms_p99"], "-", color=color, label=f"{label}: TTFT p99")
    return _finish(fig, top, bottom, path, "Trace replays compared, per second",
                   "TTFT p99 (ms)", "seconds since the replay's first request")
