"""The pass-cost bench helpers (figures are printed by `mocker bench`, not asserted here)."""

from __future__ import annotations

from mocker.engine.pass_cost import (
    bench_fast_forward_cost,
    bench_pass_cost,
    long_running_scheduler,
    max_output_for,
)


def test_long_running_scheduler_is_all_decoding() -> None:
    s = long_running_scheduler(8)
    m = s.metrics()
    assert (m.running, m.waiting) == (8, 0)
    res = s.step(0.0)
    assert (res.batch_size, res.decode_requests, res.prefill_tokens) == (8, 8, 0)
    assert len(res.signals) == 8 and not any(x.completed for x in res.signals)
    assert res.duration_ms == 0.0  # speedup 0


def test_bench_outputs_fit_the_pool_together() -> None:
    s = long_running_scheduler(256)
    assert s.metrics().running == 256
    assert max_output_for(s.args, 256) == 16384 // 256 * 32 - 128


def test_bench_pass_cost_reports_microseconds() -> None:
    us = bench_pass_cost(4, passes=20, repeats=2)
    assert 0.0 < us < 100_000.0


def test_bench_fast_forward_cost_reports_microseconds() -> None:
    us = bench_fast_forward_cost(4, passes=20, repeats=2)
    assert 0.0 < us < 100_000.0
