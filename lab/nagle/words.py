"""The Nagle verdict in words: the one place a `Verdict`'s findings become sentences.

Every sentence of `lab nagle`'s terminal output, `report.md` and `nagle.json["verdict"]["text"]`
comes from here, from the data in `lab.nagle.verdict`; nothing else writes verdict
prose, so a change of wording is a change of this file only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lab.nagle.findings import Finding
from lab.nagle.kernel_facts import DELACK_MIN_MS, KernelFacts
from lab.nagle.stats import MIN_SAMPLES, StallStats


def pct(share: float) -> str:
    """A share in percent; small non-zero shares keep a decimal (1 of 200 is 0.5%, not 0%)."""
    if 0 < share < 0.01:
        return f"{100 * share:.1f}%"
    return f"{100 * share:.0f}%"


def describe(stats: StallStats) -> str:
    """One clause about a distribution: "95% in a 44.1 ms cluster (bimodal)" and the like."""
    if stats.n == 0:
        return "no samples"
    if stats.too_few:
        return f"too few samples ({stats.n} < {MIN_SAMPLES})"
    if stats.cluster_n == 0:
        return f"0% in a stall cluster (p50 {stats.p50_ms:.1f} ms, max {stats.max_ms:.1f} ms)"
    return (
        f"{pct(stats.cluster_share)} in a {stats.cluster_median_ms:.1f} ms cluster "
        f"({stats.cluster_excess_ms:.1f} ms above the fastest decile, {stats.shape})"
    )


def _timer(k: int | None, facts: KernelFacts | None) -> str:
    kernel = f"; {facts.sentence()}" if facts else ""
    if k == 1:
        return f"the delayed-ACK timer{kernel}"
    if k == 2:
        return f"two delayed-ACK timers stacked{kernel}"
    return f"not near the {DELACK_MIN_MS:.0f} ms delayed-ACK timer{kernel}"


_FAST_REF = {
    "fresh_median": "the fresh-connection median",
    "fast_median": "the fast requests' median",
    "fastest_decile": "the fastest decile",
}

Words = Callable[[Mapping[str, Any], KernelFacts | None], str]


def _reproduced(v: Mapping[str, Any], facts: KernelFacts | None) -> str:
    s1, c1 = v["suspect"], v["control"]
    return (
        f"reproduced: with {v['suspect_label']}, {pct(s1.cluster_share)} of "
        f"concurrency-{v['single']} requests wait in a {s1.cluster_median_ms:.1f} ms cluster "
        f"({v['delta_ms']:.1f} ms above the control's median: {_timer(v['timer'], facts)}); "
        f"with {v['control_label']}, {pct(c1.cluster_share)}"
    )


def _partly(v: Mapping[str, Any], facts: KernelFacts | None) -> str:
    return (
        f"partly reproduced: with {v['suspect_label']}, {describe(v['suspect'])} "
        f"({_timer(v['timer'], facts)}); with {v['control_label']}, {describe(v['control'])}"
    )


def _not_reproduced(v: Mapping[str, Any], facts: KernelFacts | None) -> str:
    s1, c1 = v["suspect"], v["control"]
    return (
        f"not reproduced: with {v['suspect_label']}, {describe(s1)} (p50 {s1.p50_ms:.1f} ms); "
        f"with {v['control_label']}, {describe(c1)} (p50 {c1.p50_ms:.1f} ms)"
    )


def _stall_present(v: Mapping[str, Any], facts: KernelFacts | None) -> str:
    r1 = v["stats"]
    return (
        f"stall present: {pct(r1.cluster_share)} of single-stream requests on one reused "
        f"connection wait in a {r1.cluster_median_ms:.1f} ms cluster "
        f"({v['delta_ms']:.1f} ms above {_FAST_REF[v['fast_ref']]}, "
        f"{r1.cluster_excess_ms:.1f} ms above the fastest decile; distribution {r1.shape}; "
        f"{_timer(v['timer'], facts)})"
    )


def _no_stall(v: Mapping[str, Any], facts: KernelFacts | None) -> str:
    r1 = v["stats"]
    text = (
        f"no stall: single-stream TTFT on one reused connection is {r1.shape} "
        f"(p10 {r1.p10_ms:.1f} ms, p50 {r1.p50_ms:.1f} ms, p99 {r1.p99_ms:.1f} ms), "
        f"{pct(r1.cluster_share)} of requests >= {r1.threshold_ms:.0f} ms above "
        "the fastest decile"
    )
    return text + (f" ({facts.sentence()})" if facts else "")


def _both(v: Mapping[str, Any]) -> str:
    return f"({pct(v['reused_share'])} vs {pct(v['share'])})"


#: Headlines and findings, by kind. Launched findings about the higher concurrency are
#: clauses appended to the headline ("; at concurrency 32 ..."); external ones are joined by "; ".
HEADLINES: dict[str, Words] = {
    "missing_arm": lambda v, _: (
        f"cannot decide: arm {v['arm']!r} has no concurrency-{v['single']} samples"
    ),
    "too_few_launched": lambda v, _: (
        f"too few samples: {v['suspect_n']} ({v['suspect']}) and {v['control_n']} "
        f"({v['control']}) concurrency-{v['single']} requests, need >= {v['needed']}"
    ),
    "too_few_external": lambda v, _: (
        f"too few samples: {v['n']} single-stream requests on a reused connection, "
        f"need >= {v['needed']}"
    ),
    "reproduced": _reproduced,
    "partly_reproduced": _partly,
    "not_reproduced": _not_reproduced,
    "stall_present": _stall_present,
    "no_stall": _no_stall,
}

CLAUSES: dict[str, Words] = {
    "many_falls": lambda v, _: (
        f"; at concurrency {v['many']} the cluster falls to {pct(v['share'])}"
    ),
    "many_stays": lambda v, _: (
        f"; at concurrency {v['many']} the cluster stays at {pct(v['share'])}"
    ),
    "many_control_clear": lambda v, _: f" (control: {pct(v['share'])})",
    "many_control_queues": lambda v, _: (
        f", but the control's is {pct(v['share'])} too (TTFT p50 {v['suspect_p50_ms']:.1f} vs "
        f"{v['control_p50_ms']:.1f} ms): at that level requests queue, and the probe cannot "
        "tell a stall from queueing there"
    ),
}

FINDINGS: dict[str, Words] = {
    "traffic_no_lower": lambda v, _: (
        f"under continuous traffic (concurrency {v['many']}) TTFT p50 is {v['p50_ms']:.1f} ms, "
        f"no lower than the single-stream cluster ({v['cluster_median_ms']:.1f} ms): either the "
        "stall persists there (e.g. per-connection delayed ACK with one request per connection) "
        "or queueing hides it"
    ),
    "traffic_vanishes": lambda v, _: (
        f"it vanishes under continuous traffic (concurrency {v['many']}: {pct(v['share'])}), "
        "as a delayed-ACK stall does (other requests' traffic carries the ACK) and as engine "
        "queueing would not"
    ),
    "traffic_shrinks": lambda v, _: (
        f"it shrinks under continuous traffic (concurrency {v['many']}: {pct(v['share'])})"
    ),
    "traffic_persists": lambda v, _: (
        f"it persists under continuous traffic (concurrency {v['many']}: {pct(v['share'])}): "
        "per-connection delayed ACK with one request per connection, or not a network stall"
    ),
    "fresh_absent": lambda v, _: (
        f"present on a reused connection and absent on fresh ones {_both(v)}: consistent with "
        "the client-facing HTTP connection's state (the server's response path writing headers "
        "and the first chunk separately without TCP_NODELAY, meeting the client's delayed ACK "
        "on a kept-alive connection), not with the engine"
    ),
    "fresh_present": lambda v, _: (
        f"present on fresh connections too {_both(v)}: the client's HTTP connection is not the "
        "cause; consistent with a persistent connection behind the frontend (its request plane "
        "to the workers) or with the engine"
    ),
    "fresh_reduced": lambda v, _: f"reduced on fresh connections {_both(v)}: partly per-connection",
    "nonstream_absent": lambda v, _: (
        f"present when streaming and absent when not {_both(v)}: points at the streaming "
        "response path (one small write per event) rather than at the engine"
    ),
    "nonstream_present": lambda v, _: (
        f"present without streaming too {_both(v)}: not specific to the SSE response path"
    ),
    "nonstream_reduced": lambda v, _: f"reduced without streaming {_both(v)}",
    "gap_persists": lambda v, _: (
        f"with {v['label']}: still {pct(v['share'])} (idle time does not end it, as it does not "
        "end delayed-ACK pingpong mode)"
    ),
    "gap_gone": lambda v, _: f"with {v['label']}: gone ({pct(v['share'])}): idle time ends it",
    "gap_reduced": lambda v, _: (
        f"with {v['label']}: reduced to {pct(v['share'])} (back to back: {pct(v['reused_share'])})"
    ),
}


def verdict_text(headline: Finding, findings: Sequence[Finding],
                 facts: KernelFacts | None) -> str:
    """A verdict's sentence: the headline, then its clauses and findings."""
    text = HEADLINES[headline.kind](headline.values, facts)
    clauses = [f for f in findings if f.kind in CLAUSES]
    others = [f for f in findings if f.kind not in CLAUSES]
    text += "".join(CLAUSES[f.kind](f.values, facts) for f in clauses)
    if others:
        text += "; " + "; ".join(FINDINGS[f.kind](f.values, facts) for f in others)
    return text


_SHAPE_NAMES = {
    "fresh": "fresh connection per request",
    "nonstream": "non-streaming (TTFT = full response time)",
}


def arm_line(finding: Finding) -> str:
    """One detail line per arm (launched) or traffic shape (external)."""
    v = finding.values
    if finding.kind == "arm":
        single = describe(v["single_stats"])
        line = f"{v['name']} ({v['label']}): concurrency {v['single']}: {single}"
        if v["many_stats"] is not None:
            line += f"; concurrency {v['many']}: {describe(v['many_stats'])}"
        return line
    shape = v["shape"]
    if shape == "many":
        return f"concurrency {v['many']}: {describe(v['stats'])}"
    if shape == "gap":
        return f"{v['label']}: {describe(v['stats'])}"
    return f"{_SHAPE_NAMES[shape]}: {describe(v['stats'])}"
