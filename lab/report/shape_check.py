"""Whether runs of different load shapes can be compared (`lab compare`, docs/open-loop.md).

A closed loop's levels are requests in flight, an open loop's offered rates, a trace replay's
the trace's own times: levels of different kinds measure different loads, and no level of one
lines up with a level of another, so such runs are refused. Runs of one kind that differ in
something that changes the load at the same level (the arrival process, the cap on requests
in flight, the trace or its speed, conversations, the request lengths) are compared with a
warning that says what differs."""

from __future__ import annotations

from typing import Any

from lab.report.shape import load_shape

#: What a level is, per kind of shape.
LEVELS = {"closed": "its levels are requests in flight",
          "rate": "its levels are offered request rates",
          "trace": "its level is the trace's own times"}


class ShapeMismatch(ValueError):
    """Runs whose load shapes make a comparison meaningless; the message says why."""


def shape_kind(sweep: dict[str, Any]) -> str:
    """'trace', 'rate' or 'closed' (a run without a sweep section: closed, as before rates)."""
    if sweep.get("trace"):
        return "trace"
    if sweep.get("rates"):
        return "rate"
    return "closed"


def _differences(base: dict[str, Any], other: dict[str, Any]) -> list[str]:
    """What differs between two sweeps of one kind, in words, beside the level axis."""
    out = []
    kind = shape_kind(base)
    if kind == "rate" and base.get("arrival", "poisson") != other.get("arrival", "poisson"):
        out.append(f"arrivals {base.get('arrival', 'poisson')} vs "
                   f"{other.get('arrival', 'poisson')} (the same rate is a different load)")
    if base.get("max_concurrency") != other.get("max_concurrency"):
        out.append(f"--max-concurrency {base.get('max_concurrency') or 'none'} vs "
                   f"{other.get('max_concurrency') or 'none'} (a cap holds requests back)")
    if kind == "trace":
        a, b = base["trace"], other["trace"]
        for key, what in (("path", "trace"), ("requests", "trace requests"),
                          ("speed", "trace speed"), ("block_size", "hash block size")):
            if a.get(key) != b.get(key):
                out.append(f"{what} {a.get(key)} vs {b.get(key)}")
    ca, cb = base.get("conversations") or {}, other.get("conversations") or {}
    if ca.get("turns", 1) != cb.get("turns", 1) or ca.get("think_ms", 0) != cb.get("think_ms", 0):
        out.append(f"conversations of {ca.get('turns', 1)} vs {cb.get('turns', 1)} turns "
                   f"(think {ca.get('think_ms', 0):g} vs {cb.get('think_ms', 0):g} ms)")
    wa, wb = base.get("workload") or {}, other.get("workload") or {}
    for key in ("isl", "osl", "endpoint", "stream"):
        if kind == "trace" and key in ("isl", "osl"):
            continue  # the trace sets the lengths
        if key in wa and key in wb and wa[key] != wb[key]:
            out.append(f"{key} {wa[key]} vs {wb[key]}")
    return out


def check_shapes(labels: list[str], sweeps: list[dict[str, Any]]) -> list[str]:
    """Warnings (one sentence per run that differs from the first) for runs that can be
    compared; ShapeMismatch naming the runs and their shapes for runs that cannot."""
    kinds = [shape_kind(s) for s in sweeps]
    if len(set(kinds)) > 1:
        shapes = "; ".join(f"{label}: {load_shape(s)} ({LEVELS[k]})"
                           for label, k, s in zip(labels, kinds, sweeps, strict=True))
        raise ShapeMismatch(
            f"cannot compare runs of different load shapes ({shapes}): their levels are "
            "different loads and none lines up with another; compare runs of one shape")
    warnings = []
    for label, sweep in zip(labels[1:], sweeps[1:], strict=True):
        diff = _differences(sweeps[0], sweep)
        if diff:
            warnings.append(f"warning: {label} differs from {labels[0]} in its load beside the "
                            f"levels: {'; '.join(diff)}; its deltas compare different loads")
    return warnings
