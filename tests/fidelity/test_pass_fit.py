"""The linear pass model's fit (lab.fidelity.pass_fit): pure arithmetic on probe figures."""

from __future__ import annotations

import math

import pytest

from lab.fidelity.fit_report import linear_markdown
from lab.fidelity.pass_fit import DECODE, PREFILL_GAP, TTFT, equations, fit_linear, prefill_chunks
from lab.fidelity.probes import Probe, ProbeResult
from mocker.engine.timing import LinearPass, prefill_pairs

TRUTH = LinearPass(pass_ms=5.5, token_ms=0.13, seq_ms=0.2, kv_token_ms=0.0006,
                   attention_mpair_ms=110.0, request_ms=3.0, request_token_ms=0.002)
PATH_MS = 4.0  # the lab's own path, subtracted from each TTFT
BUDGET = 2048


def _result(probe: Probe, ttft: float = math.nan, step: float = math.nan,
            gap: float = math.nan) -> ProbeResult:
    return ProbeResult(probe=probe, ttft_ms_p50=ttft, itl_ms_p50=step, decode_step_ms=step,
                       latency_ms_p50=math.nan, ok=8, failed=0, prefill_gap_ms=gap)


def _truth_results(noise: dict[str, float] | None = None, added: int = 0,
                   truth: LinearPass = TRUTH,
                   batch_conc: tuple[int, ...] = (1, 8, 32, 64, 128)) -> list[ProbeResult]:
    """Probe figures a target running `truth` would give (times 1 + noise[probe name]); with
    `added`, a target that computes that many more prompt tokens than the ISL (a BOS)."""
    noise = noise or {}
    out = []
    for i, isl in enumerate((64, 256, 1024, 4096)):
        p = Probe("context", isl, 32, 1, 8, 1, i, added)
        tokens = isl + added
        ttft = PATH_MS + truth.request_latency_ms(tokens) + sum(
            truth.pass_time_ms(n, prefill_pairs(n, before), 1, 0, 0)
            for n, before in prefill_chunks(tokens, BUDGET))
        step = truth.pass_time_ms(0, 0.0, 1, 1, round(p.decode_kv_tokens))
        out.append(_result(p, ttft, step))
        o = Probe("overlap", isl, 64, 2, 16, 2, 10 + i, added)
        # the gap seen is the longest: the chunk with the most attention pairs
        n, before = max(prefill_chunks(tokens, BUDGET - 1), key=lambda c: prefill_pairs(*c))
        gap = (truth.pass_time_ms(n, prefill_pairs(n, before), 2, 1, 0)
               - truth.pass_time_ms(0, 0.0, 1, 1, 0))
        out.append(_result(o, gap=gap))
    for i, (c, isl) in enumerate([(c, 64) for c in batch_conc]
                                 + [(c, 1024) for c in batch_conc if c <= 32]):
        p = Probe("batch", isl, 128, c, 2 * c, c, 100 + i, added)
        out.append(_result(p, step=truth.pass_time_ms(0, 0.0, c, c,
                                                      round(p.decode_kv_tokens))))
    return [r if r.probe.name not in noise else
            _result(r.probe, r.ttft_ms_p50 * (1 + noise[r.probe.name]),
                    r.decode_step_ms * (1 + noise[r.probe.name]), r.prefill_gap_ms)
            for r in out]


def test_prefill_chunks_fill_the_budget_in_order() -> None:
    assert prefill_chunks(4096, 2048) == [(2048, 0), (2048, 2048)]
    assert prefill_chunks(100, 2048) == [(100, 0)]


def test_each_probe_figure_is_one_equation() -> None:
    eqs, warnings = equations(_truth_results(), {isl: PATH_MS for isl in (64, 4096)}, BUDGET)
    kinds = [e.figure for e in eqs]
    assert (kinds.count(TTFT), kinds.count(PREFILL_GAP), kinds.count(DECODE)) == (4, 4, 12)
    assert not warnings
    long = next(e for e in eqs if e.figure == TTFT and e.source.startswith("context-isl4096"))
    assert long.features[0] == 2.0  # two passes: the budget is 2048


def test_fit_recovers_the_passes_of_a_known_engine() -> None:
    fit = fit_linear(_truth_results(), {64: PATH_MS, 4096: PATH_MS}, BUDGET)
    got = fit.pass_model
    for prefill, seqs, decodes, kv in [(512, 1, 0, 0), (2048, 1, 0, 0), (0, 32, 32, 30_000),
                                       (300, 9, 8, 5000)]:
        pairs = prefill_pairs(prefill, 0)
        assert got.pass_time_ms(prefill, pairs, seqs, decodes, kv) == pytest.approx(
            TRUTH.pass_time_ms(prefill, pairs, seqs, decodes, kv), rel=0.01)
    assert all(abs(r["residual_pct"]) < 1 for r in fit.residuals())


def test_fit_recovers_a_decode_step_flat_up_to_a_batch_bound() -> None:
    """A target whose passes cost at least 6 rows (a decode step flat from 1 to 6 sequences,
    then 0.33 ms more per sequence, like vLLM on this machine's CPU): the fit keeps that bound,
    not a neighbour, predicts passes on both sides of it, and holds every probe within 1%.
    Without the bound, one slope cannot hold the flat start and the rest."""
    truth = LinearPass(pass_ms=3.4, token_ms=0.13, seq_ms=0.2, kv_token_ms=0.0004,
                       attention_mpair_ms=100.0, request_ms=2.5, weight_bound_rows=6.0)
    results = _truth_results(truth=truth, batch_conc=(1, 4, 8, 16, 32, 64, 128))
    fit = fit_linear(results, {64: PATH_MS, 4096: PATH_MS}, BUDGET)
    assert fit.bound_rows == 6.0
    assert fit.timing()["weight_bound_rows"] == 6.0
    got = fit.pass_model
    for prefill, seqs, decodes, kv in [(0, 1, 1, 200), (0, 3, 3, 600), (0, 12, 12, 2400),
                                       (512, 1, 0, 0), (300, 9, 8, 5000)]:
        pairs = prefill_pairs(prefill, 0)
        assert got.pass_time_ms(prefill, pairs, seqs, decodes, kv) == pytest.approx(
            truth.pass_time_ms(prefill, pairs, seqs, decodes, kv), rel=0.01)
    assert all(abs(r["residual_pct"]) < 1 for r in fit.residuals())
    assert fit.bound_rows_evidence[0.0] > 100 * fit.bound_rows_evidence[6.0]
    assert "`weight_bound_rows` 6" in "\n".join(linear_markdown(fit))
    plain = fit_linear(_truth_results(), {64: PATH_MS, 4096: PATH_MS}, BUDGET)
    assert plain.bound_rows == 0.0 and "weight_bound_rows" not in plain.timing()


def test_a_target_that_adds_a_bos_is_fitted_on_the_tokens_it_computes() -> None:
    """vLLM computes an ISL 4096 prompt as 4097 tokens: three passes at a budget of 2048, the
    third of one token. The probes carry the added token, so the fit counts that pass and
    recovers the request terms; counted as 4096, the third pass would be read as latency."""
    fit = fit_linear(_truth_results(added=1), {64: PATH_MS, 4096: PATH_MS}, BUDGET)
    long = next(e for e in fit.equations if e.figure == TTFT
                and e.source.startswith("context-isl4096"))
    assert long.features[0] == 3.0
    got = fit.pass_model
    for tokens in (65, 1025, 4097):
        assert got.request_latency_ms(tokens) == pytest.approx(
            TRUTH.request_latency_ms(tokens), rel=0.05)
    assert all(abs(r["residual_pct"]) < 1 for r in fit.residuals())


def test_a_first_token_floor_is_fitted_as_a_floor_and_a_path_latency_as_a_delay() -> None:
    """A target whose serving path holds the first token until 40 ms after arrival (Dynamo's
    stack, docs/fidelity.md) and whose prefill passes carry a 16 ms constant: the fit reads the
    request terms as a floor, recovers it and the constant, and predicts every TTFT as
    max(floor, prefill). The plain TRUTH target (a 3 ms delay) stays a delay."""
    floor_truth = LinearPass(pass_ms=5.5, token_ms=0.015, kv_token_ms=0.00003,
                             attention_mpair_ms=0.4, prefill_pass_ms=16.0, request_ms=40.0)
    results = []
    for i, isl in enumerate((64, 256, 1024, 4096, 8192)):
        p = Probe("context", isl, 32, 1, 8, 1, i)
        prefill = sum(floor_truth.pass_time_ms(n, prefill_pairs(n, before), 1, 0, 0)
                      for n, before in prefill_chunks(isl, 8192))
        step = floor_truth.pass_time_ms(0, 0.0, 1, 1, round(p.decode_kv_tokens))
        results.append(_result(p, PATH_MS + max(prefill, 40.0), step))
        o = Probe("overlap", isl, 64, 2, 16, 2, 10 + i)
        n, before = max(prefill_chunks(isl, 8191), key=lambda c: prefill_pairs(*c))
        gap = (floor_truth.pass_time_ms(n, prefill_pairs(n, before), 2, 1, 0)
               - floor_truth.pass_time_ms(0, 0.0, 1, 1, 0))
        results.append(_result(o, gap=gap))
    for i, c in enumerate((1, 8, 32, 128)):
        p = Probe("batch", 64, 128, c, 2 * c, c, 100 + i)
        results.append(_result(p, step=floor_truth.pass_time_ms(0, 0.0, c, c,
                                                                round(p.decode_kv_tokens))))
    fit = fit_linear(results, {64: PATH_MS, 8192: PATH_MS}, 8192)
    assert fit.request_mode == "floor"
    assert fit.timing()["request_mode"] == "floor"
    assert fit.coefficients["request_ms"] == pytest.approx(40.0, rel=0.02)
    assert fit.coefficients["prefill_pass_ms"] == pytest.approx(16.0, rel=0.05)
    assert all(abs(r["residual_pct"]) < 2 for r in fit.residuals()), fit.residuals()
    assert fit.mode_evidence["floor"] < 0.5 * fit.mode_evidence["delay"]
    assert "`request_mode` floor" in "\n".join(linear_markdown(fit))
    delay = fit_linear(_truth_results(), {64: PATH_MS, 4096: PATH_MS}, BUDGET)
    assert delay.request_mode == "delay" and "request_mode" not in delay.timing()


def test_one_slow_probe_pulls_the_fit_little_and_shows_in_its_residual() -> None:
    """A probe slowed 40% by a neighbour's CPU burst: the soft-L1 fit keeps the others within
    a few percent and the report's residual names the slow one."""
    fit = fit_linear(_truth_results({"batch-isl64-osl128-c32": 0.4}), {64: PATH_MS}, BUDGET)
    res = {(r["probe"], r["figure"]): r["residual_pct"] for r in fit.residuals()}
    assert res[("batch-isl64-osl128-c32", DECODE)] < -20
    others = [abs(v) for k, v in res.items() if k[0] != "batch-isl64-osl128-c32"]
    assert max(others) < 5


def test_no_prefill_figure_is_a_clear_error() -> None:
    only_decode = [r for r in _truth_results() if r.probe.kind == "batch"]
    with pytest.raises(ValueError, match="context probe"):
        fit_linear(only_decode, {}, BUDGET)
