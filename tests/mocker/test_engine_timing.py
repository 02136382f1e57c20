"""Timing models, speedup division and KV transfer delay."""

from __future__ import annotations

from pathlib import Path

import pytest

from mocker.engine import EngineArgs, EngineRequest, Scheduler, kv_transfer_ms
from mocker.engine.timing import TimingModel, polynomial_decode_ms, polynomial_prefill_ms

CAP = 16384 * 32  # default KV pool in tokens


def test_polynomial_reference_numbers() -> None:
    assert polynomial_prefill_ms(0) == 0.0
    assert polynomial_prefill_ms(1) == pytest.approx(16.5166, abs=1e-3)
    assert polynomial_prefill_ms(1000) == pytest.approx(32.1, abs=0.05)
    assert polynomial_prefill_ms(8000) == pytest.approx(165.0, abs=0.5)
    assert polynomial_decode_ms(0.0) == pytest.approx(5.74)
    assert polynomial_decode_ms(1.0) == pytest.approx(34.01)
    assert polynomial_decode_ms(3.0) == 1.0  # floored: never collapses onto one timestamp


def test_model_uses_active_kv_fraction() -> None:
    t = TimingModel(EngineArgs())
    assert t.decode_ms(0) == pytest.approx(5.74)
    assert t.decode_ms(CAP) == pytest.approx(34.01)
    assert t.decode_ms(CAP // 2) == pytest.approx(-25.74 / 4 + 54.01 / 2 + 5.74)
    assert t.decode_ms(3 * CAP) == 1.0


def test_speedup_divides_prefill_and_decode() -> None:
    t = TimingModel(EngineArgs(speedup_ratio=10.0, decode_speedup_ratio=2.0))
    assert t.prefill_ms(1000) == pytest.approx(polynomial_prefill_ms(1000) / 10)
    assert t.decode_ms(0) == pytest.approx(5.74 / 20)
    zero = TimingModel(EngineArgs(speedup_ratio=0.0))
    assert zero.prefill_ms(1000) == 0.0
    assert zero.decode_ms(CAP) == 0.0


def test_fixed_model() -> None:
    t = TimingModel(
        EngineArgs(timing={"type": "fixed", "prefill_ms": 50.0, "decode_ms": 7.0}, speedup_ratio=2)
    )
    assert t.prefill_ms(0) == 0.0
    assert t.prefill_ms(5) == 25.0
    assert t.decode_ms(123) == 3.5


def test_profile_model_interpolates_and_extrapolates(tmp_path: Path) -> None:
    path = tmp_path / "profile.csv"
    path.write_text(
        "# measured\nkind,tokens,ms\nprefill,1000,20\nprefill,3000,60\n"
        "decode,0,5\ndecode,10000,15\n"
    )
    t = TimingModel(EngineArgs(timing={"type": "profile", "path": str(path)}))
    assert t.prefill_ms(0) == 0.0
    assert t.prefill_ms(2000) == pytest.approx(40.0)
    assert t.prefill_ms(5000) == pytest.approx(100.0)  # extrapolated
    assert t.prefill_ms(100) == pytest.approx(2.0)  # extrapolated down
    assert t.decode_ms(5000) == pytest.approx(10.0)
    assert t.decode_ms(20000) == pytest.approx(25.0)


@pytest.mark.parametrize(
    ("text", "msg"),
    [
        ("a,b,c\n", "header"),
        ("kind,tokens,ms\nprefill,1,2\n", "no decode rows"),
        ("kind,tokens,ms\nprefill,1,2\ndecode,x,3\n", "line 3"),
        ("kind,tokens,ms\nprefill,1,2\nwarmup,1,3\n", "kind"),
    ],
)
def test_bad_profile_is_a_clear_error(tmp_path: Path, text: str, msg: str) -> None:
    path = tmp_path / "p.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=msg):
        TimingModel(EngineArgs(timing={"type": "profile", "path": str(path)}))


def test_kv_transfer_delay() -> None:
    a = EngineArgs()
    # 1000 tokens x 131072 B at 64 GB/s = 2.048 ms
    assert kv_transfer_ms(a, 1000) == pytest.approx(2.048)
    assert kv_transfer_ms(a.with_overrides(speedup_ratio=2.0), 1000) == pytest.approx(1.024)
    assert kv_transfer_ms(a.with_overrides(kv_transfer_bandwidth=0.0), 1000) == 0.0
    assert kv_transfer_ms(a.with_overrides(speedup_ratio=0.0), 1000) == 0.0


def _first_pass(engine_type: str, prompt_len: int, max_out: int,
                first_token_decode: bool | None = None) -> float:
    s = Scheduler(EngineArgs(engine_type=engine_type, block_size=32,
                             first_token_decode=first_token_decode))
    s.add(EngineRequest("r", list(range(prompt_len)), max_out, lambda p: 1000 + p))
    res = s.step(0.0)
    assert len(res.signals) == 1 and res.signals[0].position == 0
    return res.duration_ms


def test_first_token_pass_cost_per_policy() -> None:
    """Both policies sample the first token from the prefill pass by default (trtllm charged a
    decode step for it until the default was set on Dynamo's and TensorRT-LLM's behaviour,
    docs/fidelity.md); with `first_token_decode` on the pass also holds a decode step, except
    for a one-token request (prefill role), which has zero decode time."""
    pre = polynomial_prefill_ms(1000)
    dec = polynomial_decode_ms(1000 / CAP)
    assert _first_pass("trtllm", 1000, 10) == pytest.approx(pre)
    assert _first_pass("vllm", 1000, 10) == pytest.approx(pre)
    assert _first_pass("trtllm", 1000, 10, True) == pytest.approx(pre + dec)
    assert _first_pass("trtllm", 1000, 1, True) == pytest.approx(pre)


def test_pass_duration_sums_prefill_and_decode_of_the_batch() -> None:
    # first_token_decode on (no longer the trtllm default), so that the pass sums both
    s = Scheduler(EngineArgs(speedup_ratio=4.0, first_token_decode=True))
    s.add(EngineRequest("a", list(range(100)), 50, lambda p: 1000))
    s.step(0.0)
    s.add(EngineRequest("b", list(range(2000, 2300)), 50, lambda p: 1000))
    res = s.step(10.0)
    # a decodes (seq 101), b prefills 300 and decodes its first token (seq 300)
    want = polynomial_prefill_ms(300) / 4 + polynomial_decode_ms((101 + 300) / CAP) / 4
    assert res.duration_ms == pytest.approx(want)
    assert (res.batch_size, res.prefill_tokens, res.decode_requests) == (2, 300, 2)


LINEAR = {"type": "linear", "pass_ms": 5.0, "token_ms": 0.1, "seq_ms": 0.3, "kv_token_ms": 0.001,
          "attention_mpair_ms": 100.0, "request_ms": 2.0, "request_token_ms": 0.01}


def test_linear_model_charges_a_mixed_pass_once_for_what_is_in_it() -> None:
    """One pass constant for a pass that decodes one request and prefills a chunk of another
    (the polynomial charges a prefill and a decode constant both), plus its tokens, sequences,
    the decode's KV and the chunk's attention pairs; speedup divides the whole pass."""
    s = Scheduler(EngineArgs(engine_type="vllm", speedup_ratio=2.0, timing=LINEAR))
    s.add(EngineRequest("a", list(range(100)), 50, lambda p: 1000))
    first = s.step(0.0)
    assert first.duration_ms == pytest.approx((5.0 + 0.1 * 100 + 0.3 + 100 * 100 * 50.5 / 1e6)
                                              / 2)
    s.add(EngineRequest("b", list(range(2000, 2300)), 50, lambda p: 1000))
    res = s.step(10.0)
    # a decodes (seq 101: one token attending to 101), b prefills 300 from scratch
    pairs = 300 * (0 + 301 / 2)
    want = 5.0 + 0.1 * (300 + 1) + 0.3 * 2 + 0.001 * 101 + 100.0 * pairs / 1e6
    assert res.duration_ms == pytest.approx(want / 2)
    assert s.timing.request_ms(300) == pytest.approx((2.0 + 0.01 * 300) / 2)


def test_linear_model_chunk_attends_to_the_chunks_before_it() -> None:
    """A prompt longer than the pass budget is prefilled in chunks; the second chunk's tokens
    attend to the first's: more pairs than the first chunk's."""
    s = Scheduler(EngineArgs(engine_type="vllm", max_num_batched_tokens=1000,
                             timing={"type": "linear", "attention_mpair_ms": 1000.0}))
    s.add(EngineRequest("a", list(range(2000)), 5, lambda p: 1000))
    one, two = s.step(0.0), s.step(100.0)
    assert one.duration_ms == pytest.approx(1000 * 500.5 / 1e3)
    assert two.duration_ms == pytest.approx(1000 * (1000 + 500.5) / 1e3)


def test_linear_fast_forward_prices_each_pass_by_its_sequences() -> None:
    """The scheduler's fast-forward (plain decode passes) charges the same as `step` would."""
    args = EngineArgs(engine_type="vllm", timing=LINEAR)
    s = Scheduler(args)
    for i in range(3):
        s.add(EngineRequest(f"r{i}", list(range(i * 100, i * 100 + 64)), 40, lambda p: 7))
    s.step(0.0)
    s.step(100.0)  # every request has reported its first token
    kv = 3 * 66  # each holds its 64 prompt tokens and 2 generated ones
    burst = s.fast_forward(200.0, 10_000.0, 30)
    assert burst.passes == 10
    want = sum(5.0 + 0.4 * 3 + 0.001 * (kv + 3 * k) for k in range(10))
    assert burst.simulated_ms == pytest.approx(want)


def test_linear_prefill_pass_constant_is_charged_once_per_pass_that_prefills() -> None:
    """`prefill_pass_ms` (Dynamo's polynomial prefill has such a constant, 16.5 ms): once for
    a pass that prefills two prompts, not per chunk, and not for a pass that only decodes."""
    s = Scheduler(EngineArgs(engine_type="vllm",
                             timing={"type": "linear", "pass_ms": 1.0, "prefill_pass_ms": 20.0}))
    s.add(EngineRequest("a", list(range(100)), 5, lambda p: 1000))
    s.add(EngineRequest("b", list(range(1000, 1100)), 5, lambda p: 1000))
    assert s.step(0.0).duration_ms == pytest.approx(21.0)
    assert s.step(100.0).duration_ms == pytest.approx(1.0)


def test_weight_bound_rows_flatten_a_small_batch_in_step_and_fast_forward() -> None:
    """With `weight_bound_rows` 4, a pass of 1 to 4 sequences costs what a pass of 4 does
    (tokens and sequences both count as 4), one of 6 costs its own 6; `step` and the
    fast-forward charge alike."""
    timing = {**LINEAR, "weight_bound_rows": 4}
    for n, rows in ((1, 4), (3, 4), (6, 6)):
        s = Scheduler(EngineArgs(engine_type="vllm", timing=timing))
        for i in range(n):
            s.add(EngineRequest(f"r{i}", list(range(i * 100, i * 100 + 64)), 40, lambda p: 7))
        s.step(0.0)
        s.step(100.0)  # every request has reported its first token
        kv = n * 66
        assert s.step(200.0).duration_ms == pytest.approx(5.0 + 0.4 * rows + 0.001 * kv)
        burst = s.fast_forward(300.0, 10_000.0, 3 * n)
        assert burst.passes == 3
        assert burst.simulated_ms == pytest.approx(
            sum(5.0 + 0.4 * rows + 0.001 * (kv + n * (k + 1)) for k in range(3)))
    prefill = Scheduler(EngineArgs(engine_type="vllm", timing=timing))
    prefill.add(EngineRequest("a", list(range(100)), 5, lambda p: 1000))
    # 100 prompt tokens are past the bound; its one sequence is not
    assert prefill.step(0.0).duration_ms == pytest.approx(
        5.0 + 0.1 * 100 + 0.3 * 4 + 100.0 * 100 * 50.5 / 1e6)


@pytest.mark.parametrize(("timing", "msg"), [
    ({"type": "linear", "weight_bound_rows": -1},
     "timing.weight_bound_rows must be a finite number >= 0"),
    ({"type": "linear", "seq_ms": -1}, "timing.seq_ms must be a finite number >= 0"),
    ({"type": "linear", "per_token": 1}, "unknown key timing.per_token"),
    ({"type": "linear", "request_mode": "hold"}, "timing.request_mode must be one of"),
])
def test_bad_linear_timing_is_a_clear_error(timing: dict, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        EngineArgs(timing=timing)
