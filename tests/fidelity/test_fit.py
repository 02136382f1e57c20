"""The fit's arithmetic on hand-made probe results (no processes): what each knot is made of."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from lab.fidelity import fit as fit_module
from lab.fidelity.fit import choose_request_mode, engine_args, fit_profile, path_at
from lab.fidelity.probes import (
    DEFAULT_CONTEXT_ISL,
    Probe,
    ProbeResult,
    ProbeSet,
    admission_wait_ms,
    decode_step_ms,
    default_context_isl,
    prefill_gap_ms,
)
from mocker.engine.config import DEFAULT_MAX_NUM_BATCHED_TOKENS

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
    assert [p.kind for p in probes].count("context") == len(DEFAULT_CONTEXT_ISL)


def test_the_default_prefill_probes_reach_a_pass_budget() -> None:
    """A pass prefills up to the engine's token budget; a profile that stops short of it is
    extrapolated linearly there, while prefill grows faster (Dynamo's polynomial: 7% low at
    8192 from knots up to 4096, and ISL 1024 at c=32 / 128 ran 4.6% / 6.5% fast). A smaller
    budget (vLLM's 2048 on CPU) is filled twice by the longest default length; a context length
    too short for the budget's prompt leaves it out."""
    lengths = default_context_isl(DEFAULT_MAX_NUM_BATCHED_TOKENS, None)
    assert max(lengths) >= DEFAULT_MAX_NUM_BATCHED_TOKENS
    assert max(default_context_isl(2048, 8192)) >= 2 * 2048
    assert max(default_context_isl(8192, 8192)) < 8192


def test_a_fit_short_of_the_pass_budget_says_so() -> None:
    ctx = [Probe("context", t, 8, 1, 5, 1, i) for i, (t, *_) in enumerate(DYNAMO_LENGTHS)]
    short = fit_profile([_result(p, 40.0 + i, 6.0) for i, p in enumerate(ctx)], {}, "vllm")
    assert any("below a pass's token budget" in w for w in short.warnings)
    full = Probe("context", DEFAULT_MAX_NUM_BATCHED_TOKENS, 8, 1, 5, 1, 99)
    fit = fit_profile([_result(p, 40.0 + i, 6.0) for i, p in enumerate([*ctx, full])], {},
                      "vllm")
    assert not any("below a pass's token budget" in w for w in fit.warnings)


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


def test_prefill_pass_is_found_behind_a_held_first_token() -> None:
    """B is sent at 22 ms and prefilled in A's 30 -> 60 ms pass (10 ms step + 20 ms prefill),
    but its path holds B's first token back until 100 ms: the gap at B's first token is a plain
    one. The held pass is the longest gap between B's send and its first token."""
    a = [0, 10, 20, 30, 60, 70, 80, 90, 100, 110, 120]  # ms
    b = [100.0, 100.2, 100.4, 110.0]
    frame = pd.DataFrame({
        "ok": [True, True], "warmup": [False, True],
        "sent_ns": [-50 * MS, 22 * MS],
        "first_ns": [a[0] * MS, int(b[0] * MS)],
        "chunk_times_ns": [[t * MS for t in a], [int(t * MS) for t in b]],
    })
    assert prefill_gap_ms(frame) == pytest.approx(20.0)
    assert decode_step_ms(frame) == pytest.approx(10.0)
    # its pass began at 30 ms, 8 ms after it was sent
    assert admission_wait_ms(frame) == pytest.approx(8.0)


def test_a_first_token_burst_is_no_decode_step() -> None:
    """A stream whose first token was held: the tokens made meanwhile come with it (0.2 ms
    apart), then the rest of a running pass (4.6 ms), then 10 ms steps."""
    t = [100.0, 100.2, 100.4, 105.0, 115.0, 125.0]
    frame = pd.DataFrame({
        "ok": [True], "warmup": [False], "sent_ns": [0], "first_ns": [100 * MS],
        "chunk_times_ns": [[int(x * MS) for x in t]],
    })
    assert decode_step_ms(frame) == pytest.approx(10.0)


@pytest.mark.parametrize("burst", [[100.0, 101.5, 101.7, 101.9],  # the first gap late
                                   [100.0, 100.2, 101.6, 101.8]])  # one inside it late
def test_a_first_token_burst_with_a_late_token_is_no_decode_step(burst: list[float]) -> None:
    """The same burst on a loaded machine: one of its gaps is 1.4-1.5 ms, longer than any
    step's floor, and the burst still ends at its last token, not at that gap (a CI run's
    floor probe fitted its sub-millisecond rest as a 0.56 ms step)."""
    t = [*burst, 106.5, 116.5, 126.5]
    frame = pd.DataFrame({
        "ok": [True], "warmup": [False], "sent_ns": [0], "first_ns": [100 * MS],
        "chunk_times_ns": [[int(x * MS) for x in t]],
    })
    assert decode_step_ms(frame) == pytest.approx(10.0)


#: (T, rest, prefill, first decode) of Dynamo 1.6.1's calibration (docs/fidelity.md): TTFT
#: minus the lab's path flat at ~35-41 ms while the prefill grows 17.5 -> 32.5 ms
DYNAMO_LENGTHS = [(64, 41.1, 17.5, 0.0), (256, 37.8, 20.4, 0.0), (1024, 35.2, 32.5, 0.0),
                  (4096, 67.7, 67.7, 0.0)]


def test_request_mode_tells_a_floor_from_a_delay() -> None:
    mode, ev = choose_request_mode(DYNAMO_LENGTHS)
    assert mode == "floor" and 35.0 < ev["floor_ms"] < 42.0
    delay = [(t, 30.0 + pf, pf, 0.0) for t, _, pf, _ in DYNAMO_LENGTHS]
    assert choose_request_mode(delay)[0] == "delay"
    # no path beyond the lab's: both models fit; the delay is kept
    noise = (0.4, -0.3, 0.2, 0.0)
    alike = [(t, pf + d, pf, 0.0)
             for (t, _, pf, _), d in zip(DYNAMO_LENGTHS, noise, strict=True)]
    assert choose_request_mode(alike)[0] == "delay"


def test_a_floor_fit_writes_request_mode_floor(tmp_path: Path) -> None:
    ctx = [Probe("context", t, 8, 1, 5, 1, i) for i, (t, *_) in enumerate(DYNAMO_LENGTHS)]
    ovl = [Probe("overlap", t, 64, 2, 16, 2, 10 + i) for i, (t, *_) in enumerate(DYNAMO_LENGTHS)]
    results = [_result(p, rest + 5.0, 6.0)
               for p, (_, rest, _, _) in zip(ctx, DYNAMO_LENGTHS, strict=True)]
    results += [ProbeResult(p, math.nan, 6.0, 6.0, math.nan, 16, 0, prefill_gap_ms=pf)
                for p, (_, _, pf, _) in zip(ovl, DYNAMO_LENGTHS, strict=True)]
    fit = fit_profile(results, {t: 5.0 for t, *_ in DYNAMO_LENGTHS}, "vllm")
    assert fit.request_mode == "floor"
    # the engine-side time to the first token: the lab mocker releases it at the floor itself
    assert [k.ms for k in fit.request] == pytest.approx([rest for _, rest, _, _ in
                                                          DYNAMO_LENGTHS])
    args = engine_args(fit, tmp_path / "profile.csv")
    assert args["timing"]["request_mode"] == "floor"


def test_a_chunked_prefill_leaves_both_its_passes_out_of_the_decode_step() -> None:
    """Under many streams B's prefill runs in two chunks: the 10 -> 40 ms pass (the longest gap
    between B's send and its first token) and the 40 -> 60 ms one that produces B's first
    token. Both hold prefill; the decode step is the 10 ms of the others."""
    a = [0, 10, 40, 60, 70, 80, 90]
    b = [60, 70]
    frame = pd.DataFrame({
        "ok": [True, True], "warmup": [False, True],
        "sent_ns": [-50 * MS, 5 * MS],
        "first_ns": [a[0] * MS, b[0] * MS],
        "chunk_times_ns": [[t * MS for t in a], [t * MS for t in b]],
    })
    assert decode_step_ms(frame) == pytest.approx(10.0)
