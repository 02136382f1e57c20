"""Fit the mocker's ``linear`` pass model (mocker/engine/timing.py) to probe results.

Each probe figure is a sum of engine passes (and, for a time to first token, the target's
per-request path), and a pass costs a linear function of what is in it, so each figure is
one linear equation in the model's coefficients (`LINEAR_TERMS`):

* a decode step of a probe at concurrency c (`lab.fidelity.probes.decode_step_ms`) is one pass
  of c decoding sequences that attend to about c x (ISL + OSL / 2) KV tokens;
* the TTFT of a concurrency-1 ``context`` probe at T prompt tokens, minus the lab's own path,
  is the target's per-request path plus the passes that prefill T tokens: one per chunk of
  the pass token budget (`max_num_batched_tokens`), each chunk attending to the ones before;
* the prefill gap of a two-stream ``overlap`` probe (a pass that held the other stream's
  prefill, minus a plain pass) is what the largest prefill chunk adds to a pass: its tokens,
  one sequence, and its query-key pairs.

The model's one shape parameter, ``weight_bound_rows`` (a pass is charged at least that many
tokens and sequences: a small batch's matmuls are bound by reading the weights), is not
linear in the equations: `fit_linear` fits the coefficients at each of `bound_rows_candidates`
and keeps the one with the smallest error (0, no bound, among them).

The coefficients are non-negative least squares over the relative errors (each equation
divided by its measured figure, so a 5 ms decode step weighs as much as a 1 s prefill), with a
soft-L1 loss past `ROBUST_SCALE`: one probe slowed by a neighbour's CPU burst on a shared
machine (a decode step 40% off the rest) pulls the fit less than in plain least squares, and
its residual in the report says which probe it was.

The target's per-request path is a latency before scheduling (``delay``) in the equations
above. Some serving paths instead hold the first token back while the engine works (Dynamo
1.6.1's ~41 ms at concurrency 1, docs/fidelity.md "Dynamo's first-token floor"): the TTFT is
then max(floor, prefill), not their sum. `fit_linear` also fits that ``floor`` reading (the
passes from the decode steps, the prefill gaps and the TTFTs the floor does not hold; the
floor from the TTFTs it holds) and keeps it when its squared relative error is below
`FLOOR_ERROR_SHARE` of the delay reading's: a small per-request latency fits both readings
about equally, and a delay is what a plain HTTP path adds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import least_squares, nnls

from lab.fidelity.fit import Fit, path_at
from lab.fidelity.probes import ProbeResult
from mocker.engine.config import (
    LINEAR_PASS_TERMS,
    LINEAR_TERMS,
    REQUEST_MODES,
    WEIGHT_BOUND_ROWS,
)
from mocker.engine.timing import LinearPass, pass_features, prefill_pairs

#: relative error past which an equation's weight falls off (soft-L1 loss)
ROBUST_SCALE = 0.1
#: the floor reading of the request terms is kept when its summed squared relative error is
#: below this share of the delay reading's
FLOOR_ERROR_SHARE = 0.5
#: how many of an equation's features are the pass terms (the rest are the request terms)
_PASS_TERMS = len(LINEAR_PASS_TERMS)
#: `bound_rows_candidates` tries every whole number of rows up to this one, then steps of a
#: quarter (each candidate is one fit: with batch probes to c=128, 26 candidates, under 0.1 s
#: in all on the 2-core machine)
BOUND_ROWS_STEP_PAST = 16
#: what a decode figure, a time to first token and a prefill gap are called in the report
DECODE, TTFT, PREFILL_GAP = "decode step", "TTFT - lab path", "prefill gap"


@dataclass(frozen=True)
class Equation:
    """One probe figure as a linear equation: `features` . coefficients = `measured_ms`."""

    source: str  # the probe's name
    figure: str  # DECODE, TTFT or PREFILL_GAP
    features: tuple[float, ...]  # one per LINEAR_TERMS
    measured_ms: float
    note: str = ""


@dataclass
class LinearFit:
    """The fitted coefficients (ms, by `LINEAR_TERMS` name) and each equation's residual."""

    coefficients: dict[str, float]
    equations: list[Equation]
    max_num_batched_tokens: int
    warnings: list[str] = field(default_factory=list)
    request_mode: str = REQUEST_MODES[0]  # delay, or floor: the TTFT is max(request, passes)
    #: each reading's summed squared relative error (`squared_error`), by request mode
    mode_evidence: dict[str, float] = field(default_factory=dict)
    #: the rows a pass is charged at least (WEIGHT_BOUND_ROWS); the equations' features
    #: were built with it
    bound_rows: float = 0.0
    #: the chosen reading's `squared_error` at each `bound_rows` tried
    bound_rows_evidence: dict[float, float] = field(default_factory=dict)

    def predicted_ms(self, eq: Equation) -> float:
        terms = [f * self.coefficients[name]
                 for f, name in zip(eq.features, LINEAR_TERMS, strict=True)]
        if self.request_mode == "floor" and eq.figure == TTFT:
            return max(sum(terms[:_PASS_TERMS]), sum(terms[_PASS_TERMS:]))
        return sum(terms)

    def squared_error(self) -> float:
        """Sum over the equations of the squared relative error of the prediction."""
        return sum((self.predicted_ms(e) / e.measured_ms - 1.0) ** 2 for e in self.equations)

    def residuals(self) -> list[dict[str, Any]]:
        """Per equation: measured, predicted, and the predicted error in % of measured."""
        out = []
        for eq in self.equations:
            pred = self.predicted_ms(eq)
            out.append({"probe": eq.source, "figure": eq.figure, "measured_ms": eq.measured_ms,
                        "predicted_ms": pred,
                        "residual_pct": 100.0 * (pred - eq.measured_ms) / eq.measured_ms,
                        "note": eq.note})
        return out

    @property
    def pass_model(self) -> LinearPass:
        """The fitted model, as `mocker serve` runs it."""
        return LinearPass(**self.coefficients, weight_bound_rows=self.bound_rows)

    def timing(self) -> dict[str, Any]:
        """The engine args' ``timing`` object of this fit."""
        floor = {"request_mode": "floor"} if self.request_mode == "floor" else {}
        bound = {WEIGHT_BOUND_ROWS: self.bound_rows} if self.bound_rows else {}
        return {"type": "linear", **{k: float(f"{v:.6g}") for k, v in self.coefficients.items()},
                **bound, **floor}

    def to_dict(self) -> dict[str, Any]:
        return {"model": "linear", "coefficients": self.coefficients,
                WEIGHT_BOUND_ROWS: self.bound_rows,
                "bound_rows_evidence": {str(k): v for k, v in self.bound_rows_evidence.items()},
                "request_mode": self.request_mode, "mode_evidence": self.mode_evidence,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "residuals": self.residuals(), "warnings": self.warnings}


def prefill_chunks(tokens: int, budget: int) -> list[tuple[int, int]]:
    """(chunk, tokens computed before it) of a prompt prefilled alone under a pass budget."""
    out, done = [], 0
    while done < tokens:
        n = min(budget, tokens - done)
        out.append((n, done))
        done += n
    return out


def _request_features(prompt_tokens: int) -> tuple[float, float]:
    return (1.0, float(prompt_tokens))


def equations(results: Sequence[ProbeResult], lab_path_ms: Mapping[int, float],
              budget: int, bound_rows: float = 0.0) -> tuple[list[Equation], list[str]]:
    """The equations the probe results give (see the module docstring) for a model whose
    passes are charged at least `bound_rows` rows, and warnings for figures that could not be
    used."""
    eqs: list[Equation] = []
    warnings: list[str] = []
    no_request = (0.0, 0.0)
    for r in results:
        p = r.probe
        if p.kind == "prefix":
            continue  # a cached prompt: the prefix-cache effect, not a pass's cost
        if p.kind == "overlap":
            pass  # its token gaps interleave the other stream's prefill chunks: no decode figure
        elif math.isfinite(r.decode_step_ms) and r.decode_step_ms > 0:
            kv = round(p.decode_kv_tokens)
            eqs.append(Equation(p.name, DECODE,
                                pass_features(0, 0.0, p.concurrency, p.concurrency, kv, bound_rows)
                                + no_request, r.decode_step_ms,
                                f"{p.concurrency} sequences, {kv} KV tokens"))
        elif p.osl > 1:
            warnings.append(f"{p.name}: no token gaps measured (no decode equation)")
        if p.kind == "context" and math.isfinite(r.ttft_ms_p50):
            rest = r.ttft_ms_p50 - path_at(lab_path_ms, p.isl)
            if rest <= 0:
                warnings.append(f"{p.name}: TTFT {r.ttft_ms_p50:.2f} ms is not above the lab's "
                                "own path (no prefill equation)")
                continue
            chunks = prefill_chunks(p.tokens, budget)
            passes = [pass_features(n, prefill_pairs(n, before), 1, 0, 0, bound_rows)
                      for n, before in chunks]
            total = tuple(sum(col) for col in zip(*passes, strict=True))
            eqs.append(Equation(p.name, TTFT, total + _request_features(p.tokens), rest,
                                f"{len(chunks)} prefill pass(es) + the target's path"))
        if p.kind == "overlap" and math.isfinite(r.prefill_gap_ms) and r.prefill_gap_ms > 0:
            # the other stream's decode takes one token of each pass's budget
            n, before = max(prefill_chunks(p.tokens, max(budget - 1, 1)),
                            key=lambda c: prefill_pairs(*c))
            with_chunk = pass_features(n, prefill_pairs(n, before), 2, 1, 0, bound_rows)
            plain = pass_features(0, 0.0, 1, 1, 0, bound_rows)
            eqs.append(Equation(p.name, PREFILL_GAP,
                                tuple(a - b for a, b in zip(with_chunk, plain, strict=True))
                                + no_request, r.prefill_gap_ms,
                                f"a pass with a {n}-token chunk minus a plain one"))
    return eqs, warnings


def bound_rows_candidates(results: Sequence[ProbeResult]) -> list[float]:
    """The `weight_bound_rows` values `fit_linear` tries: 0 (no bound), every whole number of
    rows to `BOUND_ROWS_STEP_PAST`, then steps of a quarter, below the largest decode probe's
    concurrency (a bound at or past it would make every decode figure flat)."""
    top = max((r.probe.concurrency for r in results if r.probe.kind == "batch"), default=1)
    out, k = [], 0.0
    while k < top:
        out.append(k)
        k = k + 1 if k < BOUND_ROWS_STEP_PAST else float(math.ceil(k * 1.25))
    return out


def fit_linear(results: Sequence[ProbeResult], lab_path_ms: Mapping[int, float],
               budget: int) -> LinearFit:
    """Non-negative least squares of the relative errors over the probes' equations, at the
    `weight_bound_rows` of `bound_rows_candidates` whose fit has the smallest error (the
    smallest such bound on a tie).

    Raises ValueError when the probes give no decode or no prefill equation."""
    best: LinearFit | None = None
    evidence: dict[float, float] = {}
    for rows in bound_rows_candidates(results):
        fit = _fit_at(results, lab_path_ms, budget, rows)
        evidence[rows] = fit.squared_error()
        if best is None or evidence[rows] < evidence[best.bound_rows] * (1 - 1e-9):
            best = fit
    assert best is not None
    best.bound_rows_evidence = evidence
    return best


def _fit_at(results: Sequence[ProbeResult], lab_path_ms: Mapping[int, float], budget: int,
            bound_rows: float) -> LinearFit:
    """`fit_linear` at one `weight_bound_rows`: the delay and the floor readings."""
    eqs, warnings = equations(results, lab_path_ms, budget, bound_rows)
    if not any(e.figure == DECODE for e in eqs):
        raise ValueError("no probe measured a gap between streamed tokens (is --osl of the "
                         "probes above 1, and does the target stream one token per event?)")
    if not any(e.figure == TTFT for e in eqs):
        raise ValueError("no concurrency-1 context probe measured a TTFT: cannot fit prefill")
    delay = LinearFit(_solve(eqs), eqs, budget, warnings)
    floor = _fit_floor(eqs, budget, warnings)
    evidence = {"delay": delay.squared_error()}
    if floor is not None:
        evidence["floor"] = floor.squared_error()
    chosen = floor if floor is not None and \
        evidence["floor"] < FLOOR_ERROR_SHARE * evidence["delay"] else delay
    chosen.mode_evidence = evidence
    chosen.bound_rows = bound_rows
    return chosen


def _solve(eqs: Sequence[Equation]) -> dict[str, float]:
    """The non-negative coefficients of `eqs` (robust least squares of relative errors)."""
    a = np.array([[f / e.measured_ms for f in e.features] for e in eqs])
    # scale each column to unit norm so the solver sees terms of comparable size; a term no
    # equation has is 0 and left out (a free variable slows the solver, it does not fit)
    norms = np.linalg.norm(a, axis=0)
    used = norms > 0
    scaled = a[:, used] / norms[used]
    ones = np.ones(len(eqs))
    start, _ = nnls(scaled, ones)
    # the residuals are linear: their Jacobian is the matrix itself. Given, not estimated by
    # finite differences, the solve takes 1-2 ms instead of 10-120 ms (docs/measurements.md)
    x = least_squares(lambda c: scaled @ c - ones, start, jac=lambda c: scaled,
                      bounds=(0.0, np.inf), loss="soft_l1", f_scale=ROBUST_SCALE).x
    coefficients = np.zeros(a.shape[1])
    coefficients[used] = x / norms[used]
    return {name: float(v) for name, v in zip(LINEAR_TERMS, coefficients, strict=True)}


def _fit_floor(eqs: list[Equation], budget: int, warnings: list[str]) -> LinearFit | None:
    """The floor reading: TTFT - lab path = max(request_ms + request_token_ms x T, passes).

    The passes come from every equation but the TTFTs the floor holds (the decode steps, the
    prefill gaps, and a TTFT above the floor, with its request features set to 0); the floor
    from the TTFTs it holds. Which TTFTs the floor holds is found in two rounds: first the
    passes without any TTFT, then again with the TTFTs above the floor those passes give.
    None without a prefill gap (nothing but the TTFTs prices a prefill then) or when no TTFT
    is held by a floor."""
    if not any(e.figure == PREFILL_GAP for e in eqs):
        return None
    zero_request = (0.0,) * (len(LINEAR_TERMS) - _PASS_TERMS)
    ttfts = [e for e in eqs if e.figure == TTFT]
    passes_only = [e for e in eqs if e.figure != TTFT]
    held: list[Equation] = []
    coefficients: dict[str, float] = {}
    for _ in range(2):
        free = [Equation(e.source, e.figure, e.features[:_PASS_TERMS] + zero_request,
                         e.measured_ms, e.note) for e in ttfts if e not in held]
        coefficients = _solve(passes_only + free) if held else _solve(passes_only)
        pass_coef = [coefficients[n] for n in LINEAR_PASS_TERMS]
        held = [e for e in ttfts
                if sum(f * c for f, c in zip(e.features, pass_coef, strict=False))
                < e.measured_ms]
        if not held:
            return None
    # the floor: non-negative least squares of relative errors over the held TTFTs
    a = np.array([[f / e.measured_ms for f in e.features[_PASS_TERMS:]] for e in held])
    floor, _ = nnls(a, np.ones(len(held)))
    for name, v in zip(LINEAR_TERMS[_PASS_TERMS:], floor, strict=True):
        coefficients[name] = float(v)
    return LinearFit(coefficients, eqs, budget, warnings, request_mode="floor")


def linear_engine_args(fit: LinearFit, profile: Fit, engine_type: str) -> dict[str, Any]:
    """Engine args (`--engine-args`) that run the lab mocker on the fitted pass model; the
    prefix-cache effect is the repeated-prompt probe's, as read by the profile fit."""
    args: dict[str, Any] = {"engine_type": engine_type, "timing": fit.timing()}
    if profile.prefix_cache is not None:
        args["enable_prefix_caching"] = profile.prefix_cache
    return args
