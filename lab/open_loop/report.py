"""The open-loop parts of report.md and the time-series plot (docs/open-loop.md)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from lab.analysis.levels import level_label
from lab.analysis.timeline import Recovery
from lab.open_loop.figures import schedule_sentence, sustained_sentence
from lab.report.markdown import fnum, md_table
from lab.report.plots import _save


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
                  origin_ns: int = 0, ramps: list[tuple[int, int]] | None = None) -> Path:
    """Per-second sent and completed req/s, in flight, and TTFT p50/p99, per level; faults
    marked as vertical lines, each level's --ramp-up (start, end ns) shaded."""
    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    tl = timeline.sort_values("t_s")
    for _, g in tl.groupby([c for c in ("concurrency", "rate", "repeat") if c in tl],
                           sort=True, dropna=False):
        label = level_label(g.iloc[0])
        x = g["t_s"] + 0.5  # the middle of each one-second bin
        axes[0].plot(x, g["sent"], "-", label=f"{label} sent/s")
        axes[0].plot(x, g["completed"], "--", label=f"{label} completed/s")
        if g["errors"].any():
            axes[0].bar(x, g["errors"], width=0.8, alpha=0.4, label=f"{label} errors/s")
        axes[1].plot(x, g["in_flight"], "-", label=label)
        axes[2].plot(x, g["ttft_ms_p50"], "-", label=f"{label} TTFT p50")
        axes[2].plot(x, g["ttft_ms_p99"], ":", label=f"{label} TTFT p99")
    for k, (start, end) in enumerate(ramps or []):
        for ax in axes:
            ax.axvspan((start - origin_ns) / 1e9, (end - origin_ns) / 1e9, color="grey",
                       alpha=0.15, label="ramp-up (not measured)" if k == 0 and ax is axes[1]
                       else None)
    for f in faults or []:
        t = (f["t_ns"] - origin_ns) / 1e9
        for ax in axes:
            ax.axvline(t, color="red", alpha=0.6)
        axes[0].annotate(f["label"], (t, axes[0].get_ylim()[1]), color="red", fontsize=8,
                         va="top", rotation=90)
    axes[0].set_ylabel("requests/s")
    axes[1].set_ylabel("requests in flight")
    axes[2].set_ylabel("TTFT (ms)")
    if tl["ttft_ms_p99"].notna().any():
        axes[2].set_yscale("log")
    axes[2].set_xlabel("time since the run's first request (s)")
    for ax in axes:
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    axes[0].set_title("Per second: sent and completed requests, in flight, TTFT (by send time)")
    return _save(fig, path)
