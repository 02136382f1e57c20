"""The load client's own health in a level, kept in client.json: its CPU, event-loop lag and
send delay (docs/metrics.md, "levels.csv / levels.json: one row per level").

The client processes report what they measured of themselves (`LevelResult.procs`: window
stamps and loop lags in ns, CPU seconds from getrusage) and the requests carry the stamps the
send delay is derived from; the figures in milliseconds and percent are derived here, with the
same percentiles as every other figure (`lab.analysis.metrics.describe`).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from lab.analysis.request_times import NS_PER_MS
from lab.analysis.stats import describe, measured

NS_PER_S = 1e9


def client_health(procs: list[dict], requests: pd.DataFrame) -> dict[str, Any]:
    """The client-health figures of a level, merged over its client processes.

    `requests`: the level's requests with the derived figures (`with_request_times`); the send
    delay is over its non-warm-up requests, CPU per request over all of them.
    """
    started = min(p["started_ns"] for p in procs)
    ended = max(p["ended_ns"] for p in procs)
    wall_s = max((ended - started) / NS_PER_S, 1e-9)
    cpu_s = sum(p["cpu_s"] for p in procs)
    per_proc_pct = [100.0 * p["cpu_s"] / max((p["ended_ns"] - p["started_ns"]) / NS_PER_S, 1e-9)
                    for p in procs]
    lags = describe([lag / NS_PER_MS for p in procs for lag in p["loop_lags_ns"]])
    send = describe(measured(requests)["send_delay_ms"]) if len(requests) else describe([])
    n = len(requests)
    remote = {}
    if any("clock_offset_ns" in p for p in procs):  # client processes on other nodes (Ray)
        remote = {"clock_offsets_ns": [p.get("clock_offset_ns") for p in procs],
                  "clock_error_ns_max": max(p.get("clock_error_ns") or 0 for p in procs),
                  "nodes": [p.get("node_id") for p in procs],
                  "lost": [p["lost"] for p in procs if p.get("lost")]}
    scheduled = {p["scheduling"] for p in procs if p.get("scheduling")}
    return {
        "procs": len(procs),
        # how the client processes were scheduled (lab.load.priority): realtime or normal
        "scheduling": scheduled.pop() if len(scheduled) == 1 else (
            "mixed" if scheduled else None),
        "started_ns": started,
        "ended_ns": ended,
        "wall_s": wall_s,
        "cpu_s": cpu_s,
        "cpu_pct": 100.0 * cpu_s / wall_s,
        "cpu_pct_max_proc": max(per_proc_pct) if per_proc_pct else None,
        "cpu_ms_per_request": 1000.0 * cpu_s / n if n else None,
        "send_delay_p99_ms": send["p99"],
        "send_delay_max_ms": send["max"],
        "loop_lag_p99_ms": lags["p99"],
        "loop_lag_max_ms": lags["max"],
        # requests resent on a new connection after a reused one closed before the response
        # (the server's idle close racing the request: lab.load.http1)
        "resends": sum(p.get("resends", 0) for p in procs),
        **remote,
    }
