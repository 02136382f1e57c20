"""mocker.engine: the pure simulation of an LLM engine (no I/O, no clocks, no asyncio).

The caller (mocker.server) owns time: it calls `Scheduler.step(now_ms)` and sleeps
`PassResult.duration_ms` (against absolute deadlines) before delivering the pass's signals.
"""

from .config import EngineArgs, load_engine_args
from .scheduler import EngineMetrics, EngineRequest, PassResult, Scheduler, Signal
from .sim import run_until_idle
from .timing import kv_transfer_ms
from .tokens import (
    deterministic_token_id,
    stable_request_uuid,
    synthetic_logprob,
    token_deriver,
    token_text,
)

__all__ = [
    "EngineArgs",
    "EngineMetrics",
    "EngineRequest",
    "PassResult",
    "Scheduler",
    "Signal",
    "deterministic_token_id",
    "kv_transfer_ms",
    "load_engine_args",
    "run_until_idle",
    "stable_request_uuid",
    "synthetic_logprob",
    "token_deriver",
    "token_text",
]
