"""Per-turn figures of a `--turns` run (docs/open-loop.md "Conversations"): per level and turn
index, how many requests, the server-reported prompt tokens (which grow turn by turn, since
each turn carries the history) and TTFT / latency, so a turn's cost is seen beside the
prompt it carried."""

from __future__ import annotations

import numpy as np
import pandas as pd

#: The columns of `per_turn`, after the level's and the turn's.
TURN_COLUMNS = ("requests", "prompt_tokens_p50", "ttft_ms_p50", "ttft_ms_p99", "latency_ms_p50")


def has_turns(requests: pd.DataFrame) -> bool:
    """True for a run whose records carry a turn beyond the first (a --turns run)."""
    return "turn" in requests and bool((requests["turn"].fillna(0) > 0).any())


def _p(values: pd.Series, q: float) -> float:
    arr = values.dropna().to_numpy(dtype=np.float64)
    return float(np.percentile(arr, q)) if len(arr) else float("nan")


def per_turn(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per (level, turn) over the measured (not warm-up) successful requests:
    `requests` counts every measured request of the turn, failed ones included; the prompt
    tokens are the server's (usage) only: a request whose server reported none adds nothing
    (the column is NaN when none did)."""
    if not has_turns(requests):
        return pd.DataFrame()
    req = requests[~requests["warmup"]] if "warmup" in requests else requests
    keys = [k for k in ("concurrency", "rate") if k in req]
    rows = []
    for key, g in req.groupby([*keys, "turn"], sort=True, dropna=False):
        ok = g[g["ok"]]
        usage = ok[ok["input_tokens_source"] == "usage"] if "input_tokens_source" in ok else ok[:0]
        rows.append({**dict(zip([*keys, "turn"], key, strict=True)),
                     "requests": len(g),
                     "prompt_tokens_p50": _p(usage["input_tokens"], 50),
                     "ttft_ms_p50": _p(ok["ttft_ms"], 50),
                     "ttft_ms_p99": _p(ok["ttft_ms"], 99),
                     "latency_ms_p50": _p(ok["latency_ms"], 50)})
    out = pd.DataFrame(rows)
    out["turn"] = out["turn"].astype(int)
    return out
