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

The coefficients are non-negative least squares over the relative errors (each equation
divided by its measured figure, so a 5 ms decode step weighs as much as a 1 s prefill), with a
soft-L1 loss past `ROBUST_SCALE`: one probe slowed by a neighbour's CPU burst on a shared
machine (a decode step 40% off the rest) pulls the fit less than in plain least squares, and
its residual in the report says which probe it was.
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
from mocker.engine.config import LINEAR_TERMS
from mocker.engine.timing import pass_features, prefill_pairs

#: relative error past which an equation's weight falls off (soft-L1 loss)
ROBUST_SCALE = 0.1
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

    def predicted_ms(self, eq: Equation) -> float:
        return sum(f * self.coefficients[name]
                   for f, name in zip(eq.features, LINEAR_TERMS, strict=True))

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

    def timing(self) -> dict[str, Any]:
        """The engine args' ``timing`` object of this fit."""
        return {"type": "linear", **{k: float(f"{v:.6g}") for k, v in self.coefficients.items()}}

    def to_dict(self) -> dict[str, Any]:
        return {"model": "linear", "coefficients": self.coefficients,
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
              budget: int) -> tuple[list[Equation], list[str]]:
    """The equations the probe results give (see the module docstring), and warnings for
    figures that could not be used."""
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
                                pass_features(0, 0.0, p.concurrency, p.concurrency, kv)
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
            chunks = prefill_chunks(p.isl, budget)
            passes = [pass_features(n, prefill_pairs(n, before), 1, 0, 0)
                      for n, before in chunks]
            total = tuple(sum(col) for col in zip(*passes, strict=True))
            eqs.append(Equation(p.name, TTFT, total + _request_features(p.isl), rest,
                                f"{len(chunks)} prefill pass(es) + the target's path"))
        if p.kind == "overlap" and math.isfinite(r.prefill_gap_ms) and r.prefill_gap_ms > 0:
            # the other stream's decode takes one token of each pass's budget
            n, before = max(prefill_chunks(p.isl, max(budget - 1, 1)),
                            key=lambda c: prefill_pairs(*c))
            with_chunk = pass_features(n, prefill_pairs(n, before), 2, 1, 0)
            plain = pass_features(0, 0.0, 1, 1, 0)
            eqs.append(Equation(p.name, PREFILL_GAP,
                                tuple(a - b for a, b in zip(with_chunk, plain, strict=True))
                                + no_request, r.prefill_gap_ms,
                                f"a pass with a {n}-token chunk minus a plain one"))
    return eqs, warnings


def fit_linear(results: Sequence[ProbeResult], lab_path_ms: Mapping[int, float],
               budget: int) -> LinearFit:
    """Non-negative least squares of the relative errors over the probes' equations.

    Raises ValueError when the probes give no decode or no prefill equation."""
    eqs, warnings = equations(results, lab_path_ms, budget)
    if not any(e.figure == DECODE for e in eqs):
        raise ValueError("no probe measured a gap between streamed tokens (is --osl of the "
                         "probes above 1, and does the target stream one token per event?)")
    if not any(e.figure == TTFT for e in eqs):
        raise ValueError("no concurrency-1 context probe measured a TTFT: cannot fit prefill")
    a = np.array([[f / e.measured_ms for f in e.features] for e in eqs])
    # scale each column to unit norm so the solver sees terms of comparable size
    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0
    scaled = a / norms
    ones = np.ones(len(eqs))
    start, _ = nnls(scaled, ones)
    x = least_squares(lambda c: scaled @ c - ones, start, bounds=(0.0, np.inf),
                      loss="soft_l1", f_scale=ROBUST_SCALE).x
    coefficients = {name: float(v) for name, v in zip(LINEAR_TERMS, x / norms, strict=True)}
    return LinearFit(coefficients, eqs, budget, warnings)


def linear_engine_args(fit: LinearFit, profile: Fit, engine_type: str) -> dict[str, Any]:
    """Engine args (`--engine-args`) that run the lab mocker on the fitted pass model; the
    prefix-cache effect is the repeated-prompt probe's, as read by the profile fit."""
    args: dict[str, Any] = {"engine_type": engine_type, "timing": fit.timing()}
    if profile.prefix_cache is not None:
        args["enable_prefix_caching"] = profile.prefix_cache
    return args
