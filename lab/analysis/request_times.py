"""The per-request time metrics, derived once (docs/metrics.md, "Definitions").

The client stores ns stamps; analysis derives every ms figure once. A request's record (and
its row of requests.parquet) carries `perf_counter_ns` stamps and counts only: `scheduled_ns`,
`sent_ns`, `first_ns` / `end_ns` (its first and last content chunk), `done_ns`, every content
chunk's arrival (`chunk_times_ns`) and `output_tokens`. `with_request_times` turns such a frame,
read from requests.parquet or built from the client's in-memory records (`requests_frame`), into
the frame every consumer reads, with the millisecond columns of REQUEST_MS_COLUMNS.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

NS_PER_MS = 1e6

#: The per-request figures derived here, in milliseconds; never stored.
REQUEST_MS_COLUMNS = ("send_delay_ms", "ttft_ms", "ttst_ms", "latency_ms", "itl_ms",
                      "held_ms", "ttft_intended_ms", "latency_intended_ms", "ttfr_ms", "ttfo_ms")


def _ns(df: pd.DataFrame, column: str) -> pd.Series:
    """A stamp column as float64 (NaN where absent); a frame without the column gets NaN."""
    if column not in df:
        return pd.Series(np.nan, index=df.index, dtype="float64")
    return pd.to_numeric(df[column], errors="coerce").astype("float64")


def _second_chunk_ns(df: pd.DataFrame) -> pd.Series:
    """The arrival of each request's second content chunk (NaN with fewer than two)."""
    if "chunk_times_ns" not in df:
        return pd.Series(np.nan, index=df.index, dtype="float64")
    return pd.Series([t[1] if isinstance(t, list | tuple | np.ndarray) and len(t) > 1 else np.nan
                      for t in df["chunk_times_ns"]], index=df.index, dtype="float64")


def with_request_times(requests: pd.DataFrame) -> pd.DataFrame:
    """`requests` with the derived per-request figures (ms).

    send delay = sent - scheduled; TTFT = first content chunk - sent; latency = last content
    chunk - sent; TTST = second - first content chunk; ITL = (latency - TTFT) / (output tokens
    - 1), for more than one output token. Open-loop requests (docs/open-loop.md) also get the
    figures from their intended send time, corrected for coordinated omission: held = scheduled
    - intended, TTFT (intended) = first content chunk - intended, latency (intended) = last
    content chunk - intended. A reasoning stream's TTFR = first reasoning chunk - sent and TTFO =
    first answer chunk - sent (a run recorded before these stamps: TTFO = TTFT). NaN where a
    request lacks the stamps (no content chunk, too few
    chunks or tokens, no intended send time).
    """
    sent = _ns(requests, "sent_ns")
    first = _ns(requests, "first_ns")
    ttft = (first - sent) / NS_PER_MS
    latency = (_ns(requests, "end_ns") - sent) / NS_PER_MS
    tokens = _ns(requests, "output_tokens")
    intended = _ns(requests, "intended_ns")
    derived = {
        "send_delay_ms": (sent - _ns(requests, "scheduled_ns")) / NS_PER_MS,
        "ttft_ms": ttft,
        "ttst_ms": (_second_chunk_ns(requests) - first) / NS_PER_MS,
        "latency_ms": latency,
        "itl_ms": ((latency - ttft) / (tokens - 1)).where(tokens > 1),
        "held_ms": (_ns(requests, "scheduled_ns") - intended) / NS_PER_MS,
        "ttft_intended_ms": (first - intended) / NS_PER_MS,
        "latency_intended_ms": (_ns(requests, "end_ns") - intended) / NS_PER_MS,
        # reasoning streams (docs/metrics.md "Reasoning"): time to the first reasoning chunk
        # and to the first answer chunk (TTFO; TTFT when no chunk was reasoning only)
        "ttfr_ms": (_ns(requests, "first_reasoning_ns") - sent) / NS_PER_MS,
        "ttfo_ms": (_ns(requests, "first_answer_ns").fillna(first) - sent) / NS_PER_MS,
    }
    return requests.assign(**derived)


def requests_frame(records: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Request rows (stamps and counts: `lab.load.record.RequestRecord.row()`, or a probe's own
    dicts) as a frame with the derived figures."""
    return with_request_times(pd.DataFrame.from_records(list(records)))


def stored_columns(requests: pd.DataFrame) -> pd.DataFrame:
    """`requests` without the derived figures: what a run directory keeps."""
    return requests.drop(columns=[c for c in REQUEST_MS_COLUMNS if c in requests])
