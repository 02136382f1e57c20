"""The per-request time metrics, defined once (docs/metrics.md, "Definitions").

The load client stores nanosecond stamps (`sent_ns` and every content chunk's arrival); every
millisecond figure of a request is derived from them here, both when the client writes its
record and when `lab report` re-derives a run from requests.parquet. Pure Python, no pandas:
the client process imports it without the analysis stack.
"""

from __future__ import annotations

from collections.abc import Sequence

NS_PER_MS = 1e6


def request_times_ms(
    sent_ns: int, chunk_times_ns: Sequence[int] | None, output_tokens: int | None
) -> dict[str, float | None]:
    """TTFT, latency, TTST and ITL in milliseconds; None where a request has too few chunks.

    TTFT = first content chunk - sent; latency = last content chunk - sent; TTST = second -
    first content chunk; ITL = (latency - TTFT) / (output tokens - 1).
    """
    if chunk_times_ns is None or len(chunk_times_ns) == 0:
        return {"ttft_ms": None, "latency_ms": None, "ttst_ms": None, "itl_ms": None}
    first, last = chunk_times_ns[0], chunk_times_ns[-1]
    ttft = (first - sent_ns) / NS_PER_MS
    latency = (last - sent_ns) / NS_PER_MS
    ttst = (chunk_times_ns[1] - first) / NS_PER_MS if len(chunk_times_ns) > 1 else None
    toks = output_tokens or 0
    itl = (latency - ttft) / (toks - 1) if toks > 1 else None
    return {"ttft_ms": ttft, "latency_ms": latency, "ttst_ms": ttst, "itl_ms": itl}
