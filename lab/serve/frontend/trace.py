"""What happened to one request: its workers, its timestamps (perf_counter_ns) and its outcome.

One `Trace` per HTTP request, made by `FrontendApp._generate`; the dispatcher fills the workers
and the END's values, the request's writer (`lab/serve/frontend/writer.py`) the token stamps, and
the encoders (`encode.py`) read it for `usage` and `nvext`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class Trace:
    """What happened to one request (worker ids, timestamps in perf_counter_ns, outcome)."""

    request_id: str
    received_ns: int
    received_wall_ms: float
    prefill_worker_id: str | None = None
    decode_worker_id: str | None = None
    prefill_start_ns: int = 0
    prefill_end_ns: int = 0
    dispatch_ns: int = 0
    first_token_ns: int = 0
    last_token_ns: int = 0
    end_ns: int = 0
    tokens: int = 0
    finish: str | None = None
    stop_reason: Any = None
    usage: dict[str, Any] | None = None
    migrations: int = 0
    moved_from: list[str] | None = None  # workers a leg failed on before another took over
    status: int = 200  # HTTP status sent (200 also for a stream that ended with an error event)
    outcome: str = "success"

    def record_end(self, end: dict[str, Any]) -> None:
        """Keep the outcome the request's END reports."""
        self.finish = end.get("finish")
        self.stop_reason = end.get("stop_reason")
        self.usage = end.get("usage")

    def timing(self) -> dict[str, Any]:
        """nvext.timing (milliseconds; request_received_ms is wall-clock epoch ms)."""
        recv = self.received_ns
        first_leg = self.prefill_start_ns or self.dispatch_ns
        if self.prefill_start_ns:
            prefill_ms = (
                _ms(self.prefill_end_ns - self.prefill_start_ns) if self.prefill_end_ns else None
            )
        else:
            prefill_ms = (
                _ms(self.first_token_ns - self.dispatch_ns) if self.first_token_ns else None
            )
        return {
            "request_received_ms": round(self.received_wall_ms, 3),
            "prefill_wait_time_ms": _ms(first_leg - recv) if first_leg else None,
            "prefill_time_ms": prefill_ms,
            "ttft_ms": _ms(self.first_token_ns - recv) if self.first_token_ns else None,
            "total_time_ms": _ms((self.end_ns or time.perf_counter_ns()) - recv),
        }

    def worker_ids(self) -> dict[str, Any]:
        ids: dict[str, Any] = {
            "prefill_worker_id": self.prefill_worker_id,
            "decode_worker_id": self.decode_worker_id,
        }
        if self.moved_from:
            ids["moved_from"] = self.moved_from
        return ids


def _ms(ns: int) -> float:
    return round(ns / 1e6, 3)
