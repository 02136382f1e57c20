"""mocker.engine: the pure simulation of an LLM engine (no I/O, no clocks, no asyncio).

The caller owns time. Loop (see `sim.run_until_idle` for the simulated-clock version):
step at `now`; the pass's signals become visible at the absolute deadline
`now + duration_ms`, which is also the next pass's `now`; when `has_work()` is false or a pass
did nothing (batch 0, no signals), wake at `next_ready_ms()` or on a new request.

Pass `token_at=token_deriver(seed, request_id)` (one BLAKE3 hash per request, a SplitMix64
step per token): it is the fastest form of `deterministic_token_id` and the hot path calls it
once per token.
"""

from .config import EngineArgs, reasoning_span
from .scheduler import Burst, EngineMetrics, EngineRequest, PassResult, Scheduler, Signal
from .sim import run_until_idle
from .timing import kv_transfer_ms
from .tokens import (
    DEFAULT_ALLOWED_IDS,
    allowed_token_ids,
    deterministic_token_id,
    stable_request_uuid,
    synthetic_logprob,
    token_deriver,
    token_text,
    with_reasoning_span,
)

__all__ = [
    "DEFAULT_ALLOWED_IDS",
    "Burst",
    "EngineArgs",
    "EngineMetrics",
    "EngineRequest",
    "PassResult",
    "Scheduler",
    "Signal",
    "allowed_token_ids",
    "deterministic_token_id",
    "kv_transfer_ms",
    "reasoning_span",
    "run_until_idle",
    "stable_request_uuid",
    "synthetic_logprob",
    "token_deriver",
    "token_text",
    "with_reasoning_span",
]
