"""What happened over time: per level, per second (docs/open-loop.md, "Time series").

Bins are whole seconds since the run's first request (its first intended send, else its first
actual send), on the same perf_counter_ns clock as events.jsonl, so a fault lines up with them.

    t_s, t_ns      the bin's start: seconds since the origin, and its perf_counter_ns stamp
    intended       requests whose intended send falls in the bin (open-loop levels)
    sent           requests actually sent in the bin
    completed      successful requests whose last content chunk falls in the bin (req/s)
    errors         failed requests that ended in the bin (a cancelled one is no failure)
    out_tok_s      output tokens that arrived in the bin (each content chunk counts its
                   request's tokens per chunk)
    in_flight      requests sent and not ended at the bin's end
    ttft / itl     p50 and p99 over the requests sent in the bin (ms); ttft_intended_p99 from
                   their intended send
    bin_s          the bin's width (1 s in timeline.parquet; the timeline plot sizes each
                   level's bins to the level: level_bin_ns)

`recovery` says how long after a fault the TTFT p99 came back within 10% of its level before
the fault.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from lab.analysis.levels import level_keys
from lab.analysis.stats import cancelled_mask

BIN_NS = 1_000_000_000
#: A level's stamps spanning more seconds than this are not on one clock (e.g. shards whose
#: perf counters were never put on the wall clock): binning them per second would take memory
#: without bound, so the level gets no time series and the report says why.
MAX_LEVEL_SPAN_S = 86_400
#: TTFT p99 within this fraction of its pre-fault level counts as recovered.
RECOVERY_TOLERANCE = 0.10


class TimelineError(ValueError):
    """A level whose stamps cannot be binned per second (MAX_LEVEL_SPAN_S)."""


def run_origin_ns(requests: pd.DataFrame) -> int:
    intended = requests["intended_ns"].dropna() if "intended_ns" in requests else pd.Series([])
    sent = requests["sent_ns"].dropna()
    candidates = [int(s.min()) for s in (intended, sent) if len(s)]
    return min(candidates) if candidates else 0


def _pct(values: pd.Series, q: float) -> float:
    v = values.dropna()
    return float(np.percentile(v, q)) if len(v) else float("nan")


def _count(stamps: pd.Series, edges: np.ndarray) -> np.ndarray:
    s = stamps.dropna().astype("int64").to_numpy()
    return np.histogram(s, bins=edges)[0]


#: Bin widths a plot may size a level's bins to (level_bin_ns), in ms: round numbers.
NICE_BINS_MS = (10, 20, 50, 100, 200, 250, 500, 1000, 2000, 5000, 10_000, 30_000, 60_000)
#: About this many bins per level on a plot: enough to show a trend, few enough that each bin
#: holds many requests.
BINS_PER_LEVEL = 12


def level_span_ns(df: pd.DataFrame) -> int:
    """From a level's first (intended or actual) send to its last end."""
    starts = [df[c].dropna().min() for c in ("intended_ns", "sent_ns") if c in df]
    ends = [df[c].dropna().max() for c in ("end_ns", "done_ns", "sent_ns") if c in df]
    starts, ends = [s for s in starts if pd.notna(s)], [e for e in ends if pd.notna(e)]
    return int(max(ends) - min(starts)) if starts and ends else 0


def level_bin_ns(df: pd.DataFrame) -> int:
    """A bin width for plotting one level: the smallest round width (NICE_BINS_MS) that cuts
    its span into at most BINS_PER_LEVEL bins. One-second bins draw a 0.5-4 s level as one to
    four points; this draws every level as a curve."""
    want = level_span_ns(df) / BINS_PER_LEVEL
    return next((ms * 1_000_000 for ms in NICE_BINS_MS if ms * 1_000_000 >= want),
                NICE_BINS_MS[-1] * 1_000_000)


def level_timeline(df: pd.DataFrame, origin_ns: int, bin_ns: int = BIN_NS) -> pd.DataFrame:
    """Rows of one level's requests (`with_request_times` applied) per bin of `bin_ns` (one
    second unless a plot asks for its level's own width: the counts are then per bin)."""
    starts = [df[c].dropna().min() for c in ("intended_ns", "sent_ns") if c in df
              and df[c].notna().any()]
    ends = [df[c].dropna().max() for c in ("end_ns", "done_ns") if df[c].notna().any()]
    if not starts:
        return pd.DataFrame()
    first = int((int(min(starts)) - origin_ns) // bin_ns)
    last = int((int(max([*ends, *starts])) - origin_ns) // bin_ns)
    if (last - first + 1) * bin_ns > MAX_LEVEL_SPAN_S * BIN_NS:
        raise TimelineError(
            f"no time series: a level's stamps span {(last - first + 1) * bin_ns / 1e9:,.0f} s, "
            f"more than "
            f"{MAX_LEVEL_SPAN_S:,} s, so they are not on one clock (requests.parquet's "
            "sent_ns/end_ns mix clocks)")
    edges = origin_ns + bin_ns * np.arange(first, last + 2, dtype=np.int64)
    ok = df["ok"].astype(bool)
    end = df["end_ns"].astype("float64").fillna(df["done_ns"].astype("float64"))
    done = df["done_ns"].astype("float64").fillna(end)
    tokens = np.zeros(len(edges) - 1)
    for times, n_tok, n_chunks in zip(df.loc[ok, "chunk_times_ns"], df.loc[ok, "output_tokens"],
                                      df.loc[ok, "chunks"], strict=True):
        if times is None or not len(times) or not n_chunks:
            continue
        tokens += np.histogram(np.asarray(times, dtype=np.int64), bins=edges)[0] * (
            float(n_tok or 0) / float(n_chunks))
    sent = df["sent_ns"].astype("float64")
    bin_of = np.floor((sent - origin_ns) / bin_ns)
    rows = []
    for k in range(len(edges) - 1):
        lo, hi = int(edges[k]), int(edges[k + 1])
        in_bin = (bin_of == first + k) & ok
        group = df[in_bin]
        rows.append({
            "t_s": float((lo - origin_ns) / 1e9),
            "t_ns": lo,
            "in_flight": int(((sent < hi) & ~(done < hi)).sum()),
            "ttft_ms_p50": _pct(group["ttft_ms"], 50),
            "ttft_ms_p99": _pct(group["ttft_ms"], 99),
            "ttft_intended_ms_p99": _pct(group["ttft_intended_ms"], 99)
            if "ttft_intended_ms" in group else float("nan"),
            "itl_ms_p50": _pct(group["itl_ms"], 50),
            "itl_ms_p99": _pct(group["itl_ms"], 99),
        })
    out = pd.DataFrame(rows)
    out.insert(1, "intended", _count(df["intended_ns"], edges) if "intended_ns" in df else 0)
    out.insert(2, "sent", _count(df["sent_ns"], edges))
    out.insert(3, "completed", _count(end[ok], edges))
    out.insert(4, "errors", _count(done[~ok & ~cancelled_mask(df)], edges))
    out.insert(5, "out_tok_s", tokens)
    out["bin_s"] = bin_ns / 1e9
    return out


def run_timeline(requests: pd.DataFrame, level_bins: bool = False) -> pd.DataFrame:
    """timeline.parquet: the per-second rows of every level, keyed like levels.csv; with
    `level_bins`, each level in bins of its own width (level_bin_ns), for the timeline plot."""
    if requests.empty:
        return pd.DataFrame()
    origin = run_origin_ns(requests)
    keys = level_keys(requests)
    parts = []
    for key, g in requests.groupby(keys, sort=True, dropna=False):
        t = level_timeline(g, origin, level_bin_ns(g) if level_bins else BIN_NS)
        if t.empty:
            continue
        for name, value in zip(keys, key, strict=True):
            t.insert(0, name, value)
        parts.append(t)
    if not parts:
        return pd.DataFrame()
    out = pd.concat(parts, ignore_index=True)
    out.attrs["origin_ns"] = origin
    return out


@dataclass(frozen=True)
class Recovery:
    """TTFT p99 around one fault: its level before, and how long it took to come back."""

    fault_label: str
    fault_s: float  # since the run's origin
    baseline_ms: float | None  # TTFT p99 of the requests sent before the fault, in its level
    disturbed_s: float | None  # first bin start at or after the fault above the tolerance
    recovered_s: float | None  # first bin start after that within the tolerance again

    def sentence(self) -> str:
        if self.baseline_ms is None:
            return (f"{self.fault_label}: no requests were sent before the fault in its level, "
                    "so TTFT p99 has no level to come back to.")
        limit = f"within {100 * RECOVERY_TOLERANCE:.0f}% of its {self.baseline_ms:.2f} ms before"
        if self.disturbed_s is None:
            return (f"{self.fault_label}: TTFT p99 stayed {limit} the fault in every second "
                    "after it.")
        if self.recovered_s is None:
            return (f"{self.fault_label}: TTFT p99 rose above {limit} the fault "
                    f"{self.disturbed_s - self.fault_s:.0f} s after it and did not come back "
                    "within the level.")
        return (f"{self.fault_label}: TTFT p99 came back {limit} the fault "
                f"{self.recovered_s - self.fault_s:.0f} s after it (per-second bins of the "
                "requests sent in each second).")


def recovery(requests: pd.DataFrame, timeline: pd.DataFrame, fault_ns: int,
             label: str) -> Recovery:
    """How long after `fault_ns` the TTFT p99 of each second's requests came back within
    RECOVERY_TOLERANCE of the TTFT p99 of the requests sent before the fault in its level."""
    origin = int(timeline.attrs.get("origin_ns", run_origin_ns(requests)))
    fault_s = (fault_ns - origin) / 1e9
    keys = level_keys(requests)
    sent = requests["sent_ns"]
    level = requests[(sent <= fault_ns)]
    if level.empty:
        return Recovery(label, fault_s, None, None, None)
    last = level.loc[level["sent_ns"].idxmax()]
    same = np.ones(len(requests), dtype=bool)
    tl = np.ones(len(timeline), dtype=bool)
    for k in keys:
        same &= (requests[k] == last[k]).to_numpy() | (requests[k].isna() & pd.isna(last[k]))
        tl &= (timeline[k] == last[k]).to_numpy() | (timeline[k].isna() & pd.isna(last[k]))
    mine = requests[same]
    before = mine[(mine["sent_ns"] < fault_ns) & mine["ok"].astype(bool)]
    if before.empty:
        return Recovery(label, fault_s, None, None, None)
    baseline = _pct(before["ttft_ms"], 99)
    bins = timeline[tl & (timeline["t_s"] + 1.0 > fault_s)].sort_values("t_s")
    limit = baseline * (1 + RECOVERY_TOLERANCE)
    disturbed = recovered = None
    for _, b in bins.iterrows():
        p99 = b["ttft_ms_p99"]
        if disturbed is None:
            stalled = b["completed"] == 0 and b["in_flight"] > 0
            if (not pd.isna(p99) and p99 > limit) or stalled:
                disturbed = float(b["t_s"])
        elif not pd.isna(p99) and p99 <= limit:
            recovered = float(b["t_s"])
            break
    return Recovery(label, fault_s, baseline, disturbed, recovered)
