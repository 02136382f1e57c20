"""How a level is named: its key in client.json, the columns it is grouped by, its label."""

from __future__ import annotations

from typing import Any

import pandas as pd


def level_key(concurrency: int, repeat: int, rate: float | None = None) -> str:
    """A level's key in client.json: 'C/R', or 'rate=X/R' for an open-loop level."""
    if rate is None or pd.isna(rate):
        return f"{concurrency}/{repeat}"
    return f"rate={float(rate):g}/{repeat}"


def level_keys(frame: pd.DataFrame) -> list[str]:
    """The columns a level is grouped by: concurrency and repeat, plus rate in an open-loop run."""
    rated = "rate" in frame and frame["rate"].notna().any()
    return ["concurrency", "rate", "repeat"] if rated else ["concurrency", "repeat"]


def level_label(row: Any) -> str:
    """'c=32', or 'rate=50/s' for an open-loop level (a levels.csv row)."""
    rate = row.get("rate") if hasattr(row, "get") else None
    if rate is not None and not pd.isna(rate):
        return f"rate={float(rate):g}/s"
    return f"c={int(row['concurrency'])}"
