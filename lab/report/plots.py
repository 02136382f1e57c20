"""PNG plots of a run (matplotlib, Agg): every axis labelled with its unit, every line named in
the legend, titles that say what is shown."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from lab.analysis.levels import level_label
from lab.analysis.metrics import chunk_gaps_ms
from lab.analysis.stats import measured

DPI = 110
#: One colour per level: matplotlib's tab10 without its grey (which reads as 'disabled').
LEVEL_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                 "#bcbd22", "#17becf")


def _save(fig: plt.Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, bbox_inches="tight")  # "tight": legends beside the axes fit
    plt.close(fig)
    return path


def _level_key(label: str) -> tuple[int, float]:
    """'c=32' -> (0, 32.0), 'rate=20/s' -> (1, 20.0): closed-loop levels first, by value."""
    kind, _, value = label.partition("=")
    try:
        return (kind != "c", float(value.removesuffix("/s")))
    except ValueError:
        return (2, 0.0)


def level_colors(labels: Iterable[str]) -> dict[str, str]:
    """The colour of each level ('c=32', 'rate=20/s', as level_label names them), by its rank
    among `labels`: every plot of a report gets the same map (the run's levels; a comparison's:
    the union of its runs'), so a level has one colour on every plot and page."""
    ordered = sorted(set(labels), key=_level_key)
    return {lv: LEVEL_PALETTE[i % len(LEVEL_PALETTE)] for i, lv in enumerate(ordered)}


def run_level_colors(levels: pd.DataFrame) -> dict[str, str]:
    """level_colors of a levels table (by_concurrency rows) or of requests."""
    if levels.empty:
        return {}
    keys = [c for c in ("concurrency", "rate") if c in levels]
    return level_colors(level_label(r) for _, r in levels[keys].drop_duplicates().iterrows())


def _level_ticks(ax: plt.Axes, concurrency: pd.Series) -> None:
    """A log2 concurrency axis ticked at the levels themselves (32, not 2^5)."""
    ax.set_xscale("log", base=2)
    ticks = sorted({int(c) for c in concurrency.dropna()})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()


def legend_outside(ax: plt.Axes, **kwargs: Any) -> None:
    """The legend beside the axes, on the right: never over the data."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
              fontsize=kwargs.pop("fontsize", 8), **kwargs)


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    m = measured(df)
    return m[m["ok"].astype(bool)]


def throughput_vs_concurrency(levels: pd.DataFrame, path: Path, title: str = "") -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(levels["concurrency"], levels["req_s"], "o-", color="tab:blue", label="requests/s")
    if {"req_s_min", "req_s_max"} <= set(levels) and (levels.get("repeats", 1) > 1).any():
        ax.fill_between(levels["concurrency"], levels["req_s_min"], levels["req_s_max"],
                        color="tab:blue", alpha=0.2, label="requests/s, min-max over repeats")
    if "goodput_req_s" in levels and levels["goodput_req_s"].notna().any():
        ax.plot(levels["concurrency"], levels["goodput_req_s"], "^-", color="tab:green",
                label="goodput (every SLO met), requests/s")
    _level_ticks(ax, levels["concurrency"])
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("requests/s", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(levels["concurrency"], levels["out_tok_s"], "s--", color="tab:orange",
             label="output tokens/s")
    ax2.set_ylabel("output tokens/s", color="tab:orange")
    ax.set_ylim(bottom=0)
    ax2.set_ylim(bottom=0)
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper center",
              bbox_to_anchor=(0.5, -0.18), ncol=3, fontsize=8)
    ax.set_title(title or "Throughput vs concurrency")
    ax.grid(True, alpha=0.3)
    return _save(fig, path)


def latency_vs_throughput(levels: pd.DataFrame, path: Path, knee: int | None,
                          title: str = "", colors: dict[str, str] | None = None) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(levels["req_s"], levels["latency_ms_avg"], "o-", label="latency avg")
    ax.plot(levels["req_s"], levels["latency_ms_p99"], "s--", label="latency p99")
    colors = colors or run_level_colors(levels)
    for _, row in levels.iterrows():
        label = level_label(row)
        ax.annotate(label, (row["req_s"], row["latency_ms_avg"]), textcoords="offset points",
                    xytext=(6, 4), fontsize=8, color=colors.get(label, "black"))
    if knee is not None and (levels["concurrency"] == knee).any():
        row = levels[levels["concurrency"] == knee].iloc[0]
        ax.plot([row["req_s"]], [row["latency_ms_avg"]], marker="*", markersize=18,
                color="red", linestyle="none", label=f"knee (c={knee})")
    ax.set_xlabel("throughput (requests/s)")
    ax.set_ylabel("request latency (ms)")
    ax.set_ylim(bottom=0)
    ax.set_title(title or "Latency vs throughput (one point per concurrency)")
    legend_outside(ax)
    ax.grid(True, alpha=0.3)
    return _save(fig, path)


def ttft_distribution(requests: pd.DataFrame, path: Path, title: str = "",
                      colors: dict[str, str] | None = None) -> Path:
    """Per level: a histogram on log-spaced bins (log x axis) and the CDF."""
    ok = _ok(requests)
    colors = colors or run_level_colors(requests)
    fig, (ax_h, ax_c) = plt.subplots(1, 2, figsize=(12, 4.5))
    values = ok["ttft_ms"].dropna()
    lo = max(float(values.min()) if len(values) else 0.1, 1e-3)
    hi = max(float(values.max()) if len(values) else 1.0, lo * 1.01)
    bins = np.geomspace(lo, hi, 50)
    for conc, g in ok.groupby("concurrency", sort=True):
        v = g["ttft_ms"].dropna().to_numpy()
        if not len(v):
            continue
        label = f"c={conc}"
        ax_h.hist(v, bins=bins, histtype="step", linewidth=1.5, label=label,
                  color=colors.get(label))
        xs = np.sort(v)
        ax_c.plot(xs, np.arange(1, len(xs) + 1) / len(xs), label=label, color=colors.get(label))
    ax_h.set_xscale("log")
    ax_h.set_xlabel("TTFT (ms, log scale)")
    ax_h.set_ylabel("requests")
    ax_h.set_title("TTFT histogram per concurrency")
    ax_c.set_xscale("log")
    ax_c.set_xlabel("TTFT (ms, log scale)")
    ax_c.set_ylabel("fraction of requests <= x")
    ax_c.set_title("TTFT CDF per concurrency")
    if ax_c.get_legend_handles_labels()[0]:  # no successful request: no curve to label
        legend_outside(ax_c, title="concurrency")  # one legend: both panels share the colours
    for ax in (ax_h, ax_c):
        ax.grid(True, alpha=0.3, which="both")
    if title:
        fig.suptitle(title)
    return _save(fig, path)


def gap_distribution(requests: pd.DataFrame, path: Path, title: str = "",
                     colors: dict[str, str] | None = None) -> Path:
    """Inter-chunk gaps pooled per level: CDF on a log axis."""
    ok = _ok(requests)
    colors = colors or run_level_colors(requests)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for conc, g in ok.groupby("concurrency", sort=True):
        gaps = np.sort(chunk_gaps_ms(g))
        gaps = gaps[gaps > 0]
        if not len(gaps):
            continue
        ax.plot(gaps, np.arange(1, len(gaps) + 1) / len(gaps), label=f"c={conc}",
                color=colors.get(f"c={conc}"))
    ax.set_xscale("log")
    ax.set_xlabel("gap between consecutive content chunks (ms, log scale)")
    ax.set_ylabel("fraction of gaps <= x")
    ax.set_title(title or "Inter-chunk gap distribution (CDF) per concurrency")
    if ax.get_legend_handles_labels()[0]:
        legend_outside(ax, title="concurrency")
    else:
        ax.text(0.5, 0.5, "no gaps > 0: every request's chunks arrived together",
                ha="center", va="center", transform=ax.transAxes)
    ax.grid(True, alpha=0.3, which="both")
    return _save(fig, path)


def server_cpu(levels: pd.DataFrame, path: Path, title: str = "") -> Path | None:
    cols = [c for c in levels.columns if c.startswith("cpu_pct:")]
    if not cols:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    x = np.arange(len(levels))
    width = 0.8 / (len(cols) + 1)
    for i, col in enumerate(cols):
        ax.bar(x + i * width, levels[col].fillna(0), width, label=col.split(":", 1)[1])
    if "client_cpu_pct" in levels and levels["client_cpu_pct"].notna().any():
        ax.bar(x + len(cols) * width, levels["client_cpu_pct"].fillna(0), width,
               label="load client", hatch="//", color="lightgray", edgecolor="gray")
    ax.set_xticks(x + width * len(cols) / 2, [str(int(c)) for c in levels["concurrency"]])
    ax.set_xlabel("concurrency")
    ax.set_ylabel("CPU % (100 = one core), mean over the level")
    ax.set_title(title or "CPU per process per concurrency level")
    legend_outside(ax, title="process")
    ax.grid(True, axis="y", alpha=0.3)
    return _save(fig, path)


def fault_timeline(requests: pd.DataFrame, faults: list[dict], path: Path,
                   markers: list[dict] | None = None, bin_s: float = 0.5,
                   title: str = "") -> Path:
    """Completed requests/s and errors/s over time (bins of `bin_s`), the fault(s) marked.

    faults: [{"t_ns", "label"}]; markers: other events [{"t_ns", "label"}] (worker left, back, ...).
    """
    df = requests.copy()
    done = df["done_ns"].astype("float64").fillna(df["sent_ns"].astype("float64"))
    t0 = float(df["sent_ns"].min())
    df["t_s"] = (done - t0) / 1e9
    edges = np.arange(0, df["t_s"].max() + bin_s, bin_s)
    if len(edges) < 2:
        edges = np.array([0.0, bin_s])
    ok_counts, _ = np.histogram(df.loc[df["ok"].astype(bool), "t_s"], bins=edges)
    err_counts, _ = np.histogram(df.loc[~df["ok"].astype(bool), "t_s"], bins=edges)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    ax.plot(edges[:-1], ok_counts / bin_s, drawstyle="steps-post", label="successful requests/s")
    ax.plot(edges[:-1], err_counts / bin_s, drawstyle="steps-post", color="red",
            label="failed requests/s")
    for i, f in enumerate(faults):
        x = (f["t_ns"] - t0) / 1e9
        ax.axvline(x, color="black", linestyle="--",
                   label="fault injected" if i == 0 else None)
        ax.annotate(f["label"], (x, ax.get_ylim()[1] * 0.95), rotation=90, fontsize=8,
                    ha="right", va="top")
    for i, m in enumerate(markers or []):
        x = (m["t_ns"] - t0) / 1e9
        ax.axvline(x, color="gray", linestyle=":", label="worker events" if i == 0 else None)
        ax.annotate(m["label"], (x, ax.get_ylim()[1] * 0.6), rotation=90, fontsize=7,
                    ha="right", va="top", color="dimgray")
    ax.set_xlabel("time since the first request (s)")
    ax.set_ylabel(f"requests/s (completions per {bin_s:g} s bin)")
    ax.set_title(title or "Throughput and errors over time, with the fault marked")
    legend_outside(ax)
    ax.grid(True, alpha=0.3)
    return _save(fig, path)


# ----- compare overlays -----

def compare_throughput(runs: list[tuple[str, pd.DataFrame]], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, levels in runs:
        ax.plot(levels["concurrency"], levels["req_s"], "o-", label=label)
    _level_ticks(ax, pd.concat([levels["concurrency"] for _, levels in runs]))
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("requests/s")
    ax.set_ylim(bottom=0)
    ax.set_title("Throughput vs concurrency, runs compared")
    legend_outside(ax, title="run")
    ax.grid(True, alpha=0.3)
    return _save(fig, path)


def compare_latency(runs: list[tuple[str, pd.DataFrame]], path: Path,
                    knees: dict[str, int | None] | None = None) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (label, levels) in enumerate(runs):
        color = f"C{i}"
        ax.plot(levels["req_s"], levels["latency_ms_avg"], "o-", color=color,
                label=f"{label}: latency avg")
        ax.plot(levels["req_s"], levels["latency_ms_p99"], "s--", color=color,
                label=f"{label}: latency p99")
        knee = (knees or {}).get(label)
        if knee is not None and (levels["concurrency"] == knee).any():
            row = levels[levels["concurrency"] == knee].iloc[0]
            ax.plot([row["req_s"]], [row["latency_ms_avg"]], marker="*", markersize=16,
                    color=color, linestyle="none", label=f"{label}: knee (c={knee})")
    ax.set_xlabel("throughput (requests/s)")
    ax.set_ylabel("request latency (ms)")
    ax.set_ylim(bottom=0)
    ax.set_title("Latency vs throughput, runs compared")
    legend_outside(ax)
    ax.grid(True, alpha=0.3)
    return _save(fig, path)


def compare_ttft_cdf(runs: list[tuple[str, pd.DataFrame]], path: Path) -> Path:
    """TTFT CDF per run and level (line style per run, colour per level: the concurrency, or
    the rate of an open-loop level)."""
    fig, ax = plt.subplots(figsize=(8, 5))
    styles = ["-", "--", ":", "-."]

    def label_of(df: pd.DataFrame) -> pd.Series:
        if "rate" in df and df["rate"].notna().any():
            return df["rate"].map(lambda r: f"rate={float(r):g}/s")
        return df["concurrency"].map(lambda c: f"c={int(c)}")

    oks = [(label, _ok(requests)) for label, requests in runs]
    oks = [(label, ok.assign(level=label_of(ok))) for label, ok in oks if len(ok)]
    colors = level_colors(lv for _, ok in oks for lv in ok["level"].unique())
    for i, (label, ok) in enumerate(oks):
        for level, g in sorted(ok.groupby("level"), key=lambda kv: _level_key(str(kv[0]))):
            xs = np.sort(g["ttft_ms"].dropna().to_numpy())
            if not len(xs):
                continue
            ax.plot(xs, np.arange(1, len(xs) + 1) / len(xs), styles[i % len(styles)],
                    color=colors[level], label=f"{label}, {level}")
    ax.set_xscale("log")
    ax.set_xlabel("TTFT (ms, log scale)")
    ax.set_ylabel("fraction of requests <= x")
    ax.set_title("TTFT CDF, runs compared (line style = run, colour = level)")
    legend_outside(ax, fontsize=7)
    ax.grid(True, alpha=0.3, which="both")
    return _save(fig, path)
