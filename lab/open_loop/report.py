"""The open-loop parts of report.md and the time-series plot (docs/open-loop.md)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from lab.analysis.levels import level_label
from lab.analysis.timeline import Recovery
from lab.open_loop.figures import schedule_sentence, sustained_sentence
from lab.report.markdown import fnum, md_table
from lab.report.plots import _save, run_level_colors


def open_loop_table(levels: pd.DataFrame) -> str:
    """One row per rate: what was asked, sent and completed, the schedule's accuracy, and
    latency/TTFT from the actual send and from the intended send (corrected)."""
    header = ["Rate", "schedule req/s", "sent req/s", "completed req/s", "lag p50 ms", "p99",
              "max", "held", "TTFT p50 ms", "p99", "TTFT p50 (intended)", "p99",
              "Latency p99 ms", "Latency p99 (intended)", "sustained"]
    rows = []
    for _, r in levels[levels["rate"].notna()].sort_values("rate").iterrows():
        rows.append([
            f"{r['rate']:g}/s", fnum(r.get("schedule_req_s")), fnum(r.get("sent_req_s")),
            fnum(r.get("completed_req_s")), fnum(r.get("dispatch_lag_ms_p50"), 3),
            fnum(r.get("dispatch_lag_ms_p99"), 3), fnum(r.get("dispatch_lag_ms_max"), 2),
            str(int(r.get("held") or 0)), fnum(r.get("ttft_ms_p50"), 2),
            fnum(r.get("ttft_ms_p99"), 2), fnum(r.get("ttft_intended_ms_p50"), 2),
            fnum(r.get("ttft_intended_ms_p99"), 2), fnum(r.get("latency_ms_p99")),
            fnum(r.get("latency_intended_ms_p99")),
            "yes" if (r.get("sustained") or 0) >= 1 else "no",
        ])
    return md_table(header, rows)


def open_loop_markdown(levels: pd.DataFrame, arrival: str | None,
                       max_concurrency: int | None) -> str:
    cap = (f"at most {max_concurrency} in flight (--max-concurrency)" if max_concurrency
           else "no cap on requests in flight")
    parts = [f"Open loop: {arrival or 'poisson'} arrivals, {cap}. Latency and TTFT are shown "
             "from the actual send and from the intended send (corrected for coordinated "
             "omission; never below the former).", "", open_loop_table(levels), "",
             schedule_sentence(levels), "", sustained_sentence(levels)]
    return "\n".join(parts) + "\n"


def recovery_markdown(recoveries: list[Recovery]) -> str:
    return "\n".join(f"- {r.sentence()}" for r in recoveries) + "\n"


def timeline_plot(timeline: pd.DataFrame, path: Path, faults: list[dict] | None = None,
                  origin_ns: int = 0, colors: dict[str, str] | None = None,
                  ramps: list[tuple[int, int]] | None = None) -> Path:
    """Per level, sent and completed req/s, requests in flight, and TTFT p50/p99 over time, one
    colour per level on every panel (`colors`: plots.level_colors); faults marked as vertical
    lines, each level's --ramp-up (start, end ns) shaded. `timeline`: run_timeline rows, best
    with level_bins (bins sized to each level, so a level of half a second is a curve, not a
    point); rates are counts / bin_s."""
    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    tl = timeline.sort_values("t_s")
    colors = colors or run_level_colors(tl)
    widths = set()
    for _, g in tl.groupby([c for c in ("concurrency", "rate", "repeat") if c in tl],
                           sort=True, dropna=False):
        label = level_label(g.iloc[0])
        color = colors.get(label, "black")
        bin_s = g["bin_s"].to_numpy() if "bin_s" in g else np.ones(len(g))
        widths.add(float(bin_s[0]))
        mid = g["t_s"] + bin_s / 2  # rates and TTFT: the middle of each bin
        line = {"color": color, "marker": "o", "markersize": 3}
        axes[0].plot(mid, g["sent"] / bin_s, "-", **line)
        axes[0].plot(mid, g["completed"] / bin_s, "--", **{**line, "marker": "s"})
        if g["errors"].any():
            axes[0].bar(mid, g["errors"] / bin_s, width=0.8 * bin_s, alpha=0.4, color=color,
                        hatch="//")
        # in flight is counted at each bin's end
        axes[1].plot(g["t_s"] + bin_s, g["in_flight"], "-", **line)
        axes[2].plot(mid, g["ttft_ms_p50"], "-", **line)
        axes[2].plot(mid, g["ttft_ms_p99"], ":", **{**line, "marker": "^"})
    for start, end in ramps or []:
        for ax in axes:
            ax.axvspan((start - origin_ns) / 1e9, (end - origin_ns) / 1e9, color="grey",
                       alpha=0.15)
    for f in faults or []:
        t = (f["t_ns"] - origin_ns) / 1e9
        for ax in axes:
            ax.axvline(t, color="red", alpha=0.6)
        axes[0].annotate(f["label"], (t, axes[0].get_ylim()[1]), color="red", fontsize=8,
                         va="top", rotation=90)
    axes[0].set_ylabel("requests/s")
    axes[1].set_ylabel("requests in flight\n(log above 1)")
    axes[1].set_yscale("symlog", linthresh=1.0)  # c=1 next to c=256: both readable
    axes[1].set_ylim(bottom=0)
    axes[2].set_ylabel("TTFT (ms)")
    if tl["ttft_ms_p99"].notna().any():
        axes[2].set_yscale("log")
    axes[2].set_xlabel("time since the run's first request (s)")
    for ax in axes:
        ax.grid(True, alpha=0.3)
    levels = [Line2D([], [], color=c, marker="o", markersize=4, label=lv)
              for lv, c in colors.items()]
    axes[0].legend(handles=[*levels,
                            Line2D([], [], color="black", linestyle="-", label="sent/s"),
                            Line2D([], [], color="black", linestyle="--", label="completed/s")]
                   + ([Patch(facecolor="gray", alpha=0.4, hatch="//", label="errors/s")]
                      if tl["errors"].any() else [])
                   + ([Patch(facecolor="grey", alpha=0.15, label="ramp-up (not measured)")]
                      if ramps else []),
                   loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, title="level")
    axes[2].legend(handles=[Line2D([], [], color="black", linestyle="-", label="TTFT p50"),
                            Line2D([], [], color="black", linestyle=":", label="TTFT p99")],
                   loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    bins = ", ".join(f"{w:g} s" for w in sorted(widths))
    axes[0].set_title("Per level over time: sent and completed req/s, in flight, TTFT by send "
                      f"time (bins: {bins})")
    return _save(fig, path)
