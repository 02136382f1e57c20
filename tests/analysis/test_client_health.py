"""The client's own health figures, derived from what its processes report (ns, CPU seconds)
and from the requests' stamps."""

from __future__ import annotations

import pytest

from lab.analysis.client_health import client_health
from lab.analysis.request_times import requests_frame

MS = 1_000_000
S = 1_000_000_000


def test_figures_from_the_processes_and_the_stamps() -> None:
    procs = [
        {"proc": 0, "started_ns": 10 * S, "ended_ns": 12 * S, "cpu_s": 0.5,
         "loop_lags_ns": [k * MS for k in range(1, 101)]},
        {"proc": 1, "started_ns": 11 * S, "ended_ns": 12 * S, "cpu_s": 0.5, "loop_lags_ns": []},
    ]
    # send delays 1-4 ms; the warm-up's 100 ms is not counted
    records = [{"warmup": i == 0, "scheduled_ns": i * S, "sent_ns": i * S + (i or 100) * MS}
               for i in range(5)]
    c = client_health(procs, requests_frame(records))
    assert c["procs"] == 2 and c["wall_s"] == 2.0 and c["cpu_pct"] == pytest.approx(50.0)
    assert c["cpu_pct_max_proc"] == pytest.approx(50.0)  # 0.5 s of 1 s
    assert c["cpu_ms_per_request"] == pytest.approx(200.0)
    assert c["send_delay_max_ms"] == pytest.approx(4.0)
    # exact percentiles, as everywhere: linear interpolation
    assert c["send_delay_p99_ms"] == pytest.approx(3.97)
    assert c["loop_lag_p99_ms"] == pytest.approx(99.01)
    assert c["loop_lag_max_ms"] == pytest.approx(100.0)
