"""Exact summary statistics of a level's values, and the rows that count for them.

Percentiles are exact: numpy's linear interpolation over all values.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from lab.analysis.catalogue import STATS

PERCENTILES = {"p50": 50, "p90": 90, "p95": 95, "p99": 99}


def describe(values: Any) -> dict[str, float | None]:
    """Exact summary statistics: avg, std (population), min, p50, p90, p95, p99, max."""
    arr = np.asarray([v for v in values if v is not None], dtype=float)
    arr = arr[~np.isnan(arr)]
    if arr.size == 0:
        return dict.fromkeys(STATS)
    out: dict[str, float | None] = {
        "avg": float(arr.mean()),
        "std": float(arr.std()),
        "min": float(arr.min()),
        "max": float(arr.max()),
    }
    pct = np.percentile(arr, list(PERCENTILES.values()))
    for name, value in zip(PERCENTILES, pct, strict=True):
        out[name] = float(value)
    return out


def measured(df: pd.DataFrame) -> pd.DataFrame:
    """Rows that count for statistics (warm-up excluded)."""
    return df[~df["warmup"].astype(bool)]


def cancelled_mask(df: pd.DataFrame) -> pd.Series:
    """The requests the client cancelled on purpose (--cancel): neither ok nor failed (runs
    from before the column have none)."""
    if "cancelled" not in df:
        return pd.Series(False, index=df.index)
    return df["cancelled"].fillna(False).astype(bool)

