"""An open-loop level's own figures (docs/open-loop.md): the rate the client was asked for and
the rate it sent, how accurately it kept the schedule, what the concurrency cap held back,
latency and TTFT from the intended send (corrected for coordinated omission), and whether the
stack sustained the rate.

    offered rate     the level's --rate
    schedule rate    (n - 1) / (last intended send - first intended send): the drawn schedule's
                     own rate (a Poisson schedule of n requests is within ~1/sqrt(n) of offered)
    sent rate        (n - 1) / (last actual send - first actual send)
    completed rate   (k - 1) / (last response end - first response end), over the k successful
                     requests (their own span, as for the sends: unbiased for a short level)
    dispatch lag     actual send - release (the send delay; release = intended unless held)
    held             release - intended: the wait at the client under --max-concurrency
    sustained        completed rate >= 98% of the schedule rate, and latency from the intended
                     send not growing over the level (the last third's median at most 25% + 1 ms
                     above the first third's)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from lab.analysis import catalogue as cat
from lab.analysis.levels import level_label
from lab.analysis.stats import describe, measured

#: The client kept its schedule if it sent at least this fraction of the schedule's rate ...
MIN_SENT_FRACTION = 0.98
#: ... and its dispatch lag p99 stayed at or below this (ms).
MAX_LAG_P99_MS = 1.0
#: A level is sustained when requests completed at least this fraction of the schedule's rate
SUSTAIN_FRACTION = 0.98
#: and latency from the intended send did not grow by more than this (relative, absolute ms).
GROWTH_RELATIVE = 0.25
GROWTH_ABSOLUTE_MS = 1.0


def _rate(stamps: pd.Series) -> float | None:
    s = stamps.dropna().astype("float64")
    if len(s) < 2:
        return None
    span = float(s.max() - s.min())
    return (len(s) - 1) / span * 1e9 if span > 0 else None


def latency_growth(m: pd.DataFrame) -> tuple[float | None, float | None]:
    """Median latency from the intended send of the first and last third of the level's
    successful requests, in intended-send order (ms)."""
    ok = m[m["ok"].astype(bool)].sort_values("intended_ns")
    lat = ok["latency_intended_ms"].dropna().to_numpy()
    if len(lat) < 6:
        return None, None
    third = len(lat) // 3
    return float(np.median(lat[:third])), float(np.median(lat[-third:]))


def open_loop_figures(df: pd.DataFrame) -> dict[str, Any]:
    """The open-loop columns of one level's levels.csv row (`df`: the level's requests with the
    derived figures, `with_request_times`)."""
    m = measured(df)
    ok = m[m["ok"].astype(bool)]
    rate = float(df["rate"].dropna().iloc[0])
    schedule = _rate(m["intended_ns"])
    sent = _rate(m["sent_ns"])
    completed = _rate(ok["end_ns"])
    lag = describe(m["send_delay_ms"])
    held = m["held_ms"].fillna(0)
    held_stats = describe(held[held > 0])
    first, last = latency_growth(m)
    growing = (first is not None and last is not None
               and last > first * (1 + GROWTH_RELATIVE) + GROWTH_ABSOLUTE_MS)
    reference = schedule or rate
    row: dict[str, Any] = {
        "rate": rate,
        cat.SCHEDULE_REQ_S.name: schedule,
        cat.SENT_REQ_S.name: sent,
        cat.COMPLETED_REQ_S.name: completed,
        cat.SENT_FRACTION.name: sent / reference if sent and reference else None,
        **cat.DISPATCH_LAG.values(lag),
        cat.HELD.name: int((held > 0).sum()),
        **cat.HELD_MS.values(held_stats),
        cat.GROWTH_FIRST.name: first,
        cat.GROWTH_LAST.name: last,
        # 1 or 0, so that the mean over repeats is the fraction of repeats that sustained it
        cat.SUSTAINED.name: int(bool(completed is not None and reference
                                     and completed >= SUSTAIN_FRACTION * reference
                                     and not growing and len(ok) == len(m))),
    }
    for figure in (cat.TTFT_INTENDED, cat.LATENCY_INTENDED):  # per-request columns of that name
        row.update(figure.values(describe(ok[figure.name])))
    return row


def is_open_loop(levels: pd.DataFrame) -> bool:
    return "rate" in levels and bool(levels["rate"].notna().any())


def schedule_sentence(levels: pd.DataFrame) -> str:
    """Says in words whether the client kept each level's schedule (the open-loop twin of
    `lab.report.markdown.client_sentence`), and what --max-concurrency held back."""
    rated = levels[levels["rate"].notna()]
    missed, held = [], []
    for _, r in rated.iterrows():
        frac = r.get("sent_fraction")
        lag = r.get("dispatch_lag_ms_p99")
        if r.get("held", 0):
            held.append(f"{level_label(r)}: {int(r['held'])} requests held, up to "
                        f"{r['held_ms_max']:.1f} ms (p99 {r['held_ms_p99']:.1f} ms)")
            continue  # the cap, not the client, set the sending rate
        reasons = []
        if frac is not None and not pd.isna(frac) and frac < MIN_SENT_FRACTION:
            reasons.append(f"sent {r['sent_req_s']:.1f} req/s of the schedule's "
                           f"{r['schedule_req_s']:.1f} ({100 * frac:.1f}%)")
        if lag is not None and not pd.isna(lag) and lag > MAX_LAG_P99_MS:
            reasons.append(f"dispatch lag p99 {lag:.2f} ms")
        if reasons:
            missed.append(f"{level_label(r)}: " + ", ".join(reasons))
    out = []
    if missed:
        out.append("the client could not keep the schedule at " + "; ".join(missed) +
                   f" (limits: {100 * MIN_SENT_FRACTION:.0f}% of the schedule's rate, lag p99 "
                   f"{MAX_LAG_P99_MS:g} ms): those levels offered less, or later, than asked; "
                   "the latency from the intended send still counts the delay.")
    if held:
        out.append("--max-concurrency held requests at the client at " + "; ".join(held) +
                   ": their latency from the intended send includes that wait.")
    if out:
        return "schedule: " + " ".join(out)
    lag_max = rated["dispatch_lag_ms_p99"].max()
    frac_min = rated["sent_fraction"].min()
    return (f"schedule: the client kept it at every rate (dispatch lag p99 at most "
            f"{lag_max:.3f} ms, sent at least {100 * frac_min:.1f}% of the schedule's rate).")


def sustained_sentence(levels: pd.DataFrame) -> str:
    """The highest rate the stack sustained (see the module docstring), or that none was."""
    rated = levels[levels["rate"].notna()].sort_values("rate")
    ok = rated[rated["sustained"] >= 1]
    if ok.empty:
        return "saturation: no rate of the sweep was sustained."
    best = float(ok["rate"].max())
    above = rated[rated["rate"] > best]
    hi = float(above["rate"].min()) if not above.empty else None
    tail = (f"; {hi:g}/s was not, so the ceiling lies within {100 * (hi / best - 1):.0f}% "
            "above it" if hi is not None else "; no higher rate was tried")
    return (f"saturation: the highest sustained rate is {best:g} req/s (completed within "
            f"{100 * (1 - SUSTAIN_FRACTION):.0f}% of the schedule, latency not growing){tail}.")
