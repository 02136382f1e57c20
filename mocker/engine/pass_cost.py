"""Cost of one scheduler pass (the engine loop's hot path), for `mocker bench`.

`bench_pass_cost(running)` reports microseconds per `Scheduler.step` with `running` decode
sequences (speedup 0, deterministic BLAKE3 tokens, one Signal per request per pass);
`bench_fast_forward_cost(running)` the same passes run by `Scheduler.fast_forward` (what the
engine loop uses to catch up when it is behind schedule, e.g. at speedup 1000).
`long_running_scheduler(n)` builds a scheduler whose n requests decode for a long time; the
server side uses it for the wall-clock drift measurement.
"""

from __future__ import annotations

import time
from dataclasses import replace

from .config import EngineArgs
from .scheduler import EngineRequest, Scheduler
from .tokens import token_deriver

BENCH_SEED = 42
BENCH_PROMPT_LEN = 128


def long_running_scheduler(
    running: int,
    args: EngineArgs | None = None,
    *,
    prompt_len: int = BENCH_PROMPT_LEN,
    max_output_tokens: int | None = None,
    now_ms: float = 0.0,
) -> Scheduler:
    """A scheduler with `running` requests admitted and past prefill (all decoding).

    Defaults: the reference trtllm engine args with speedup 0 and max_num_seqs raised to
    `running` if needed; `max_output_tokens` defaults to the largest output for which all
    `running` requests fit the KV pool together (guaranteed_no_evict reserves it all at
    admission). Prefill passes are run at `now_ms` (their modeled time is ignored).
    """
    if args is None:
        args = EngineArgs(speedup_ratio=0.0)
    if args.max_num_seqs < running:
        args = replace(args, max_num_seqs=running)
    if max_output_tokens is None:
        max_output_tokens = max_output_for(args, running, prompt_len)
    sched = Scheduler(args)
    for i in range(running):
        key = f"bench-{i}"
        prompt = [(i * 7919 + j) % 30000 + 1000 for j in range(prompt_len)]
        sched.add(EngineRequest(key, prompt, max_output_tokens, token_deriver(BENCH_SEED, key)))
    while sched.metrics().waiting or any(_prefilling(sched)):
        if sched.step(now_ms).batch_size == 0:
            raise RuntimeError("bench scheduler made no progress")
    return sched


def max_output_for(args: EngineArgs, running: int, prompt_len: int = BENCH_PROMPT_LEN) -> int:
    """Largest max_output_tokens letting `running` requests of `prompt_len` share the pool."""
    per_request = args.num_gpu_blocks // max(running, 1) * args.block_size
    if per_request <= prompt_len + 1:
        raise ValueError(f"{running} requests of {prompt_len} tokens do not fit the KV pool")
    return per_request - prompt_len


def _prefilling(sched: Scheduler) -> list[bool]:
    return [r.computed < r.prompt_len for r in sched._running]


def bench_pass_cost(
    running: int, *, passes: int | None = None, repeats: int = 7, cpu: bool = False
) -> float:
    """Microseconds per `Scheduler.step` with `running` decode sequences (speedup 0).

    The best of `repeats` timed batches of `passes` passes (the minimum is the estimate least
    disturbed by other processes on a shared machine). `cpu=True` times the thread's CPU
    time instead of the wall clock.
    """
    if passes is None:
        passes = max(50, 5000 // max(running, 1))
    sched = long_running_scheduler(running)
    passes = max(1, min(passes, (max_output_for(sched.args, running) - 2) // repeats))
    clock = time.thread_time_ns if cpu else time.perf_counter_ns
    step = sched.step
    best = float("inf")
    for _ in range(repeats):
        t0 = clock()
        for _ in range(passes):
            step(0.0)
        best = min(best, (clock() - t0) / passes / 1000.0)
    return best


def bench_fast_forward_cost(
    running: int, *, passes: int | None = None, repeats: int = 7, cpu: bool = False
) -> float:
    """Microseconds per decode pass run by `Scheduler.fast_forward` with `running` sequences
    (best of `repeats` batches of `passes` passes, like `bench_pass_cost`)."""
    if passes is None:
        passes = max(50, 5000 // max(running, 1))
    sched = long_running_scheduler(running)
    passes = max(1, min(passes, (max_output_for(sched.args, running) - 2) // repeats))
    clock = time.thread_time_ns if cpu else time.perf_counter_ns
    best = float("inf")
    for _ in range(repeats):
        t0 = clock()
        burst = sched.fast_forward(0.0, float("inf"), passes * running)
        elapsed = clock() - t0
        if burst.passes != passes:
            raise RuntimeError(f"fast_forward ran {burst.passes} of {passes} passes")
        best = min(best, elapsed / passes / 1000.0)
    return best
