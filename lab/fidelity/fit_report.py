"""fit.md of `lab calibrate`: the probes, the knots, their residuals, and what the fit assumed."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from lab.fidelity.fit import Fit, path_at
from lab.fidelity.pass_fit import FLOOR_ERROR_SHARE, LinearFit
from lab.fidelity.placement import Placement, placement_markdown
from lab.fidelity.probes import ProbeResult
from lab.fidelity.replay import SCORED, ProbeReplay, mean_abs_error_pct
from lab.report.markdown import fnum, md_table
from mocker.engine.config import DEFAULT_FIRST_TOKEN_DECODE


def _pct(v: float) -> str:
    return "-" if not math.isfinite(v) else f"{v:+.1f}%"


def linear_markdown(fit: LinearFit) -> list[str]:
    """The linear pass model's coefficients and each probe figure's residual."""
    coef = ", ".join(f"`{k}` {v:.4g}" for k, v in fit.coefficients.items())
    rows = [[r["probe"], r["figure"], fnum(r["measured_ms"], 2), fnum(r["predicted_ms"], 2),
             _pct(r["residual_pct"]), r["note"]] for r in fit.residuals()]
    worst = max((abs(r["residual_pct"]) for r in fit.residuals()), default=math.nan)
    reading = ("a first-token floor (the TTFT is the larger of the request terms and the "
               "prefill passes)" if fit.request_mode == "floor" else
               "a latency before scheduling (added to the prefill passes)")
    errors = ", ".join(f"{mode} {err:.4f}" for mode, err in fit.mode_evidence.items())
    return ["## Linear pass model", "",
            f"Coefficients (ms; a pass's budget of {fit.max_num_batched_tokens} tokens): {coef}. "
            f"Largest residual {worst:.1f}%.", "", *_bound_rows_markdown(fit),
            f"The request terms are read as {reading}: `request_mode` {fit.request_mode} "
            f"(summed squared relative error: {errors or 'delay only'}; a floor is kept below "
            f"{FLOOR_ERROR_SHARE:g} of the delay's).", "",
            md_table(["probe", "figure", "measured ms", "model ms", "residual", "what"], rows),
            ""]


def _bound_rows_markdown(fit: LinearFit) -> list[str]:
    """Which `weight_bound_rows` the fit kept, and the error at the bounds it tried."""
    ev = fit.bound_rows_evidence
    if not ev:
        return []
    shown = sorted(ev, key=ev.__getitem__)[:3]
    others = ", ".join(f"{k:g}: {ev[k]:.4f}" for k in shown if k != fit.bound_rows)
    kept = (f"`weight_bound_rows` {fit.bound_rows:g}: a pass is charged at least "
            f"{fit.bound_rows:g} tokens and {fit.bound_rows:g} sequences (its decode step is "
            f"flat up to {fit.bound_rows:g} sequences)" if fit.bound_rows else
            "`weight_bound_rows` 0: no bound (each token and sequence adds to the pass)")
    return [f"{kept}, the smallest summed squared relative error of the {len(ev)} bounds "
            f"tried: {ev[fit.bound_rows]:.4f}, against 0 (no bound): {ev.get(0.0, math.nan):.4f}"
            + (f"; the next best {others}" if others else "") + ".", ""]


def replay_markdown(replays: Sequence[ProbeReplay], asked: str, chosen: str) -> list[str]:
    """The batch probes replayed on each fitted model, and which one engine-args.json runs."""
    if not replays:
        return []
    models = list(replays[0].models)
    scores = {m: mean_abs_error_pct(replays, m) for m in models}
    how = ("`--timing auto` chose it: the lowest mean absolute error" if asked == "auto" else
           f"`--timing {asked}` asked for it")
    names = {"ttft_ms_p50": "TTFT p50", "latency_ms_p50": "latency p50"}
    head = ["probe"] + [f"{names[f]} target ms" for f in SCORED] + \
        [f"{names[f]} {m}" for m in models for f in SCORED]
    rows = [[r.probe] + [fnum(r.measured[f], 1) for f in SCORED]
            + [_pct(r.error_pct(m, f)) for m in models for f in SCORED] for r in replays]
    summary = ", ".join(f"`{m}` {fnum(scores[m], 1)}%" for m in models)
    return ["## The batch probes replayed", "",
            "Each closed-loop batch probe run again offline on the mocker's scheduler with each "
            "fitted model (lab/fidelity/replay.py): requests that share passes, which the "
            "per-pass fits above do not test. Mean absolute error over the table: "
            f"{summary}. engine-args.json runs `{chosen}`: {how}.", "",
            md_table(head, rows), ""]


def fit_markdown(fit: Fit, results: Sequence[ProbeResult], target: str,
                 plot: Path | None, linear: LinearFit | None = None,
                 assumed: Sequence[str] = (), replays: Sequence[ProbeReplay] = (),
                 timing: tuple[str, str] | None = None,
                 placement: Placement | None = None) -> str:
    lines = [f"# Calibration of the lab mocker against {target}", ""]
    if assumed:
        lines += ["## The target's engine settings", ""] + [f"- {a}" for a in assumed] + [""]
    rows = [[r.probe.name, str(r.probe.concurrency), str(r.probe.isl), str(r.probe.osl),
             str(r.ok), str(r.failed), fnum(r.ttft_ms_p50, 2), fnum(r.decode_step_ms, 2),
             fnum(r.itl_ms_p50, 2), fnum(r.probe.decode_kv_tokens, 0)] for r in results]
    lines += ["## Probes (medians, ms)", "",
              md_table(["probe", "conc", "ISL", "OSL", "ok", "failed", "TTFT p50",
                        "decode step", "ITL p50", "decode KV tokens"], rows), ""]
    if linear is not None:
        lines += linear_markdown(linear)
    if timing is not None:
        lines += replay_markdown(replays, *timing)
    if placement is not None:
        lines += placement_markdown(placement)
    lab = ", ".join(f"{k}: {v:.2f}" for k, v in sorted(fit.lab_path_ms.items()))
    lines += ["## Profile knots and residuals", "",
              f"Lab path subtracted from TTFT, ms by prompt length (interpolated between): "
              f"{lab or '0'}. "
              f"Engine type `{fit.engine_type}`"
              + (" (its first-token decode step is subtracted too)."
                 if DEFAULT_FIRST_TOKEN_DECODE[fit.engine_type] else "."), "",
              "A residual is the knot against the profile built without it (interpolated or "
              "extrapolated from the others): how far the curve is from straight between probe "
              "points.", ""]
    rrows = [[r["kind"], fnum(r["tokens"], 0), fnum(r["ms"], 3), fnum(r["measured_ms"], 2),
              fnum(r["loo_ms"], 3), _pct(r["loo_residual_pct"]), r["source"]]
             for r in fit.residuals()]
    lines += [md_table(["kind", "tokens", "profile ms", "measured ms", "without it ms",
                        "residual", "probe"], rrows), ""]
    if fit.prefix_saving_share is not None:
        lines += [f"Prefix cache: the repeated prompt saved {100 * fit.prefix_saving_share:.0f}% "
                  f"of the fitted prefill -> `enable_prefix_caching: "
                  f"{str(fit.prefix_cache).lower()}`.", ""]
    ev = fit.mode_evidence
    if ev:
        lines += [f"Request knots as `{fit.request_mode}`: squared error over the context "
                  f"lengths of a latency before scheduling ({ev['delay_ms']:.2f} ms) "
                  f"{ev['sse_delay_ms2']:.1f} ms^2, of a first-token floor "
                  f"({ev['floor_ms']:.2f} ms, binding at {ev['floor_binds_at']:.0f} lengths) "
                  f"{ev['sse_floor_ms2']:.1f} ms^2.", ""]
    lines += ["## Path and prefill", ""]
    for k in fit.prefill:
        t = int(k.tokens)
        ttft = _ttft_at(results, t)
        if k.source.startswith("overlap"):
            extra = (f"max(first-token floor {fit.request_ms(t):.2f}, prefill {k.ms:.2f} (a pass "
                     f"seen from another stream))" if fit.request_mode == "floor" else
                     f"prefill {k.ms:.2f} (a pass seen from another stream) + the target's path "
                     f"beyond the lab's {fit.request_ms(t):.2f} (a per-request latency, no pass)")
            lines.append(f"- {t} tokens: target TTFT {fnum(ttft, 2)} ms = lab path "
                         f"{path_at(fit.lab_path_ms, t):.2f} + {extra}"
                         + (f" + first decode step {fit.decode_ms(t):.2f}"
                            if DEFAULT_FIRST_TOKEN_DECODE[fit.engine_type] else "") + ".")
        else:
            lines.append(f"- {t} tokens: target TTFT {fnum(ttft, 2)} ms; no overlap gap, so the "
                         f"prefill knot {k.ms:.2f} ms also holds the target's own path.")
    lines.append("")
    if fit.warnings:
        lines += ["## Warnings", ""] + [f"- {w}" for w in fit.warnings] + [""]
    if plot is not None:
        lines += [f"![fit]({plot.relative_to(plot.parent.parent)})", ""]
    return "\n".join(lines)


def _ttft_at(results: Sequence[ProbeResult], tokens: int) -> float:
    """The TTFT of the context probe whose prompt is `tokens` (a knot's length: the ISL and
    what the target adds)."""
    for r in results:
        if r.probe.kind == "context" and r.probe.tokens == tokens:
            return r.ttft_ms_p50
    return math.nan
