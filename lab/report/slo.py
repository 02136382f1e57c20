"""The report's SLO sentences: goodput beside throughput (at the knee, or at the peak of an
open-loop run) and the edge a `--rate auto` / `--conc auto` search found with SLOs
(lab.analysis.slo_share; docs/open-loop.md "Finding the SLO edge")."""

from __future__ import annotations

from typing import Any

import pandas as pd

from lab.analysis.knee import Knee
from lab.analysis.levels import level_label
from lab.analysis.slo_share import DEFAULT_SLO_SHARE, SLOs, slo_edge
from lab.report.markdown import fnum


def goodput_sentence(table: pd.DataFrame, knee: Knee, slos: SLOs) -> str | None:
    """'goodput (TTFT <= 50 ms): 612.0 of 640.3 req/s met every SLO (95.6%) at the knee
    (c=128); the most goodput was 630.1 req/s at c=64'; None without SLOs."""
    if table.empty or "goodput_req_s" not in table or not table["goodput_req_s"].notna().any():
        return None
    rows = table.dropna(subset=["goodput_req_s"])
    if knee.knee is not None and (rows["concurrency"] == knee.knee).any():
        at, where = rows[rows["concurrency"] == knee.knee].iloc[0], f"at the knee (c={knee.knee})"
    else:
        at = rows.loc[rows["req_s"].idxmax()]
        where = f"at the peak throughput ({level_label(at)})"
    best = rows.loc[rows["goodput_req_s"].idxmax()]
    share = at.get("slo_share")
    text = (f"goodput ({slos.words()}): {fnum(at['goodput_req_s'])} of {fnum(at['req_s'])} "
            f"req/s {where}" + (f", {100 * share:.1f}% of its requests good"
                                if share is not None and not pd.isna(share) else ""))
    if level_label(best) != level_label(at):
        text += f"; the most goodput was {fnum(best['goodput_req_s'])} req/s at {level_label(best)}"
    return text


def slo_lines(table: pd.DataFrame, levels: pd.DataFrame, knee: Knee, sweep: dict[str, Any],
              slos: SLOs | None) -> list[str]:
    """The report's SLO sentences (none without SLOs)."""
    if slos is None or not slos.given():
        return []
    out = []
    if (line := goodput_sentence(table, knee, slos)) is not None:
        out.append(line)
    search = sweep.get("search") or {}
    if search:
        edge = slo_edge(levels, search["axis"], search.get("slo_share") or DEFAULT_SLO_SHARE,
                        slos, int(search["max_levels"]))
        if edge is not None:
            out.append(edge.sentence())
    return out
