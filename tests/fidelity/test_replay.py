"""lab/fidelity/replay.py: the batch probes replayed offline on the mocker's scheduler, and the
model `lab calibrate --timing auto` picks from them."""

from __future__ import annotations

import math

import pytest

from lab.fidelity.probes import Probe, ProbeResult
from lab.fidelity.replay import best_model, mean_abs_error_pct, replay_closed_loop, replay_probes
from mocker.engine.config import EngineArgs

PREFILL_MS, DECODE_MS = 50.0, 10.0
FIXED = {"engine_type": "vllm", "timing": {"type": "fixed", "prefill_ms": PREFILL_MS,
                                           "decode_ms": DECODE_MS}}
SLOW_DECODE = {"engine_type": "vllm", "timing": {"type": "fixed", "prefill_ms": 20.0,
                                                 "decode_ms": 30.0}}


def test_a_lone_stream_replays_one_prefill_pass_then_a_decode_pass_per_token() -> None:
    args = EngineArgs.from_json(dict(FIXED))
    r = replay_closed_loop(args, isl=100, osl=5, concurrency=1, requests=3, warmup=1,
                           path_ms=2.5)
    assert r.ttft_ms_p50 == pytest.approx(PREFILL_MS + 2.5)
    assert r.latency_ms_p50 == pytest.approx(PREFILL_MS + 4 * DECODE_MS + 2.5)


def test_streams_that_start_together_share_a_prefill_pass_within_the_budget() -> None:
    """Four prompts at once: one pass holds them all when the budget does, else one pass
    each, in turn (the scheduler's own batching, which the per-pass fits never see)."""
    wide = EngineArgs.from_json({**FIXED, "max_num_batched_tokens": 4096})
    shared = replay_closed_loop(wide, isl=512, osl=2, concurrency=4, requests=4, warmup=0)
    assert shared.ttft_ms_p50 == pytest.approx(PREFILL_MS)
    narrow = EngineArgs.from_json({**FIXED, "max_num_batched_tokens": 512})
    serial = replay_closed_loop(narrow, isl=512, osl=2, concurrency=4, requests=4, warmup=0)
    # first tokens at 1, 2, 3 and 4 prefill passes (each later pass also decodes the earlier
    # streams' second token): the median is past two passes
    assert serial.ttft_ms_p50 > 2 * PREFILL_MS


def test_a_replay_that_cannot_finish_says_so() -> None:
    args = EngineArgs.from_json({**FIXED, "max_num_batched_tokens": 64,
                                 "enable_chunked_prefill": False})
    with pytest.raises(RuntimeError, match="did not finish"):
        replay_closed_loop(args, isl=100, osl=2, concurrency=1, requests=1, warmup=0)


def _results_from(args: dict, probes: list[Probe]) -> list[ProbeResult]:
    """Probe results as a target running `args` would measure them."""
    engine = EngineArgs.from_json(dict(args))
    out = []
    for p in probes:
        r = replay_closed_loop(engine, p.isl, p.osl, p.concurrency, p.requests, p.warmup)
        out.append(ProbeResult(p, r.ttft_ms_p50, math.nan, math.nan, r.latency_ms_p50,
                               p.requests, 0))
    return out


def test_auto_picks_the_model_whose_replay_matches_the_target() -> None:
    probes = [Probe("batch", 64, 16, c, 2 * c, c, 1000 + c) for c in (1, 4, 16)]
    probes.append(Probe("context", 256, 8, 1, 4, 1, 999))  # not a batch probe: not replayed
    results = _results_from(FIXED, probes)
    for order in (("fixed", "slow"), ("slow", "fixed")):
        models = {name: FIXED if name == "fixed" else SLOW_DECODE for name in order}
        replays = replay_probes(results, models, {})
        assert [r.probe for r in replays] == [p.name for p in probes if p.kind == "batch"]
        assert mean_abs_error_pct(replays, "fixed") == pytest.approx(0.0, abs=1e-9)
        assert mean_abs_error_pct(replays, "slow") > 10.0
        assert best_model(replays, list(order)) == "fixed"


def test_with_nothing_replayed_auto_keeps_the_first_model() -> None:
    assert best_model([], ["linear", "profile"]) == "linear"


def test_a_request_waits_the_timings_per_request_latency_before_it_is_scheduled() -> None:
    args = EngineArgs.from_json({"engine_type": "vllm", "timing": {
        "type": "linear", "pass_ms": 5.0, "request_ms": 7.0, "request_token_ms": 0.01}})
    r = replay_closed_loop(args, isl=100, osl=3, concurrency=1, requests=2, warmup=0)
    assert r.ttft_ms_p50 == pytest.approx(7.0 + 0.01 * 100 + 5.0)
    assert r.latency_ms_p50 == pytest.approx(r.ttft_ms_p50 + 2 * 5.0)
