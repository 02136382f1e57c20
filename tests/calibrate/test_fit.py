"""The fit's arithmetic on hand-made probe results (no processes): what each knot is made of."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from lab.calibrate import fit as fit_module
from lab.calibrate.fit import fit_profile, path_at
from lab.calibrate.probes import Probe, ProbeResult, ProbeSet, decode_step_ms

MS = 1_000_000


def _result(probe: Probe, ttft: float, step: float) -> ProbeResult:
    return ProbeResult(probe, ttft, step, step, math.nan, 5, 0)


def test_decode_step_leaves_out_the_gaps_that_held_another_prefill() -> None:
    """Stream A's gaps are 10 ms, but one of them also holds B's prefill pass (B's first token
    lands in it): that 60 ms gap is left out. A burst (a 30 ms gap, then two 0 ms ones) keeps
    its sum: 10 ms a token."""
    a = [0, 10, 20, 80, 90, 120, 120, 120]  # ms; the 20 -> 80 gap holds B's first token at 70
    b = [70, 80]
    frame = pd.DataFrame({
        "ok": [True, True], "warmup": [False, True],
        "first_ns": [a[0] * MS, b[0] * MS],
        "chunk_times_ns": [[t * MS for t in a], [t * MS for t in b]],
    })
    assert decode_step_ms(frame) == pytest.approx(10.0)


def test_prefill_knot_is_ttft_minus_lab_path_minus_first_decode_step(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a policy's first_token_decode default is on, its step is subtracted too (no policy
    has it on today: trtllm's was turned off, docs/fidelity.md; so it is patched on here)."""
    ctx = [Probe("context", isl, 8, 1, 5, 1, i) for i, isl in enumerate((100, 400))]
    batch = Probe("batch", 50, 20, 4, 8, 4, 9)
    results = [_result(ctx[0], 30.0, 4.0), _result(ctx[1], 90.0, 6.0),
               _result(batch, math.nan, 5.0)]
    assert [k.ms for k in fit_profile(results, {100: 2.0, 400: 3.0}, "trtllm").prefill] == (
        pytest.approx([28.0, 87.0]))
    monkeypatch.setitem(fit_module.DEFAULT_FIRST_TOKEN_DECODE, "trtllm", True)
    fit = fit_profile(results, {100: 2.0, 400: 3.0}, "trtllm")
    # decode knots at 100 + 4, 400 + 4 and 4 x (50 + 10) = 240 tokens
    assert [(k.tokens, k.ms) for k in fit.decode] == [(104, 4.0), (240, 5.0), (404, 6.0)]
    first_100 = 4.0 + (5.0 - 4.0) * (100 - 104) / (240 - 104)  # extrapolated below 104
    first_400 = 5.0 + (6.0 - 5.0) * (400 - 240) / (404 - 240)
    assert [k.ms for k in fit.prefill] == pytest.approx([30 - 2 - first_100, 90 - 3 - first_400])
    vllm = fit_profile(results, {100: 2.0, 400: 3.0}, "vllm")
    assert [k.ms for k in vllm.prefill] == pytest.approx([28.0, 87.0])  # no first decode step


def test_prefix_probe_sets_prefix_caching_from_the_saving() -> None:
    ctx = Probe("context", 400, 8, 1, 5, 1, 1)
    prefix = Probe("prefix", 400, 8, 1, 5, 1, 2)
    base = [_result(ctx, 100.0, 5.0)]
    cached = fit_profile([*base, _result(prefix, 10.0, 5.0)], {400: 0.0}, "vllm")
    assert cached.prefix_cache is True and cached.prefix_saving_share == pytest.approx(0.9)
    uncached = fit_profile([*base, _result(prefix, 98.0, 5.0)], {400: 0.0}, "vllm")
    assert uncached.prefix_cache is False


def test_no_gaps_is_an_error_naming_the_cause() -> None:
    ctx = Probe("context", 100, 8, 1, 5, 1, 1)
    with pytest.raises(ValueError, match="gap between streamed tokens"):
        fit_profile([_result(ctx, 30.0, math.nan)], {}, "trtllm")


def test_lab_path_is_interpolated_between_lengths() -> None:
    assert path_at({100: 2.0, 300: 4.0}, 200) == pytest.approx(3.0)
    assert path_at({}, 200) == 0.0


def test_probe_set_gives_each_probe_its_own_seed() -> None:
    probes = ProbeSet().probes()
    assert len({p.seed for p in probes}) == len(probes)
    assert [p.kind for p in probes].count("context") == 4


def test_overlap_gap_splits_ttft_into_prefill_and_request_latency() -> None:
    ctx = Probe("context", 400, 8, 1, 5, 1, 1)
    ovl = Probe("overlap", 400, 64, 2, 16, 2, 2)
    results = [_result(ctx, 100.0, 5.0),
               ProbeResult(ovl, math.nan, 5.0, 5.0, math.nan, 16, 0, prefill_gap_ms=60.0)]
    fit = fit_profile(results, {400: 10.0}, "vllm")
    assert [(k.tokens, k.ms) for k in fit.prefill] == [(400, 60.0)]
    assert [(k.tokens, k.ms) for k in fit.request] == [(400, 30.0)]  # 100 - 10 - 60
    assert fit.request_ms(400) == 30.0


def test_a_prefill_that_blocks_nobody_is_all_request_latency() -> None:
    """A held gap no longer than a plain one (the target's prefill does not hold up the other
    stream): prefill 0, the whole rest of TTFT is per-request latency."""
    ctx = Probe("context", 400, 8, 1, 5, 1, 1)
    ovl = Probe("overlap", 400, 64, 2, 16, 2, 2)
    results = [_result(ctx, 50.0, 5.0),
               ProbeResult(ovl, math.nan, 5.0, 5.0, math.nan, 16, 0, prefill_gap_ms=-0.2)]
    fit = fit_profile(results, {400: 6.0}, "vllm")
    assert [k.ms for k in fit.prefill] == [0.0] and [k.ms for k in fit.request] == [44.0]


def test_decode_knots_never_fall_with_more_kv() -> None:
    probes = [Probe("batch", 64, 32, c, 8, c, c) for c in (1, 2, 4)]  # KV 80, 160, 320
    results = [_result(p, math.nan, ms) for p, ms in zip(probes, (5.0, 7.0, 6.0), strict=True)]
    ctx = Probe("context", 100, 8, 1, 5, 1, 9)
    fit = fit_profile([*results, _result(ctx, 20.0, math.nan)], {}, "vllm")
    assert [k.ms for k in fit.decode] == [5.0, 6.5, 6.5]
    assert [k.raw_ms for k in fit.decode] == [5.0, 7.0, 6.0]
