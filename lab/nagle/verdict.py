"""The Nagle verdict as data: what a probe found, with every number, and no prose.

`launched_verdict` (the lab's own stack: suspect vs control arm) and `external_verdict` (a
server the lab did not launch: traffic shapes) return a `Verdict`: an outcome, a headline
`Finding`, further `Finding`s and one `Finding` per arm. A finding is a kind (what was
found) and the values that back it. Tests assert on these; `lab.nagle.words` is the
one place they become sentences (`Verdict.text`, `Verdict.lines`). docs/nagle.md, "The
verdict", gives the rules.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lab.nagle.findings import Finding
from lab.nagle.kernel_facts import KernelFacts, near_timer
from lab.nagle.stats import (
    ABSENT_SHARE,
    MIN_SAMPLES,
    REPRODUCED_SHARE,
    VANISHED_SHARE,
    ArmResult,
    StallStats,
)
from lab.nagle.words import arm_line, verdict_text

#: Outcomes of a launched probe and of an external one.
LAUNCHED_OUTCOMES = ("reproduced", "partly reproduced", "not reproduced", "too few samples")
EXTERNAL_OUTCOMES = ("stall present", "no stall", "too few samples")


@dataclass(frozen=True)
class Verdict:
    outcome: str  # one of LAUNCHED_OUTCOMES or EXTERNAL_OUTCOMES
    headline: Finding
    findings: tuple[Finding, ...] = ()
    arms: tuple[Finding, ...] = ()  # one "arm" finding per arm, in probe order
    facts: KernelFacts | None = None

    def kinds(self) -> list[str]:
        """The headline's and every finding's kind, in order (what tests usually ask)."""
        return [self.headline.kind, *(f.kind for f in self.findings)]

    def finding(self, kind: str) -> Finding | None:
        return next((f for f in (self.headline, *self.findings) if f.kind == kind), None)

    @property
    def text(self) -> str:
        return verdict_text(self.headline, self.findings, self.facts)

    @property
    def lines(self) -> tuple[str, ...]:
        return tuple(arm_line(f) for f in self.arms)

    def to_dict(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "text": self.text,
            "lines": list(self.lines),
            "headline": self.headline.to_dict(),
            "findings": [f.to_dict() for f in self.findings],
            "arms": [f.to_dict() for f in self.arms],
        }


def _timer(excess_ms: float | None) -> int | None:
    """1 or 2 delayed-ACK timers the stall's size matches, else None."""
    return near_timer(excess_ms)


def launched_verdict(
    arms: Mapping[str, ArmResult],
    *,
    control: str = "control",
    suspect: str = "suspect",
    single: int = 1,
    many: int | None = 32,
    facts: KernelFacts | None = None,
) -> Verdict:
    """Verdict of a probe on the launched stack: suspect (client NODELAY off, split writes) vs
    control (NODELAY on, coalesced), with a finding per arm."""
    c_arm, s_arm = arms.get(control), arms.get(suspect)
    c1 = c_arm.at(single) if c_arm else None
    s1 = s_arm.at(single) if s_arm else None
    if c_arm is None or s_arm is None or c1 is None or s1 is None:
        missing = control if c1 is None else suspect
        return Verdict(
            "not reproduced", Finding("missing_arm", {"arm": missing, "single": single})
        )
    if c1.too_few or s1.too_few:
        return Verdict(
            "too few samples",
            Finding(
                "too_few_launched",
                {"suspect": suspect, "control": control, "suspect_n": s1.n, "control_n": c1.n,
                 "single": single, "needed": MIN_SAMPLES},
            ),
        )
    findings: list[Finding] = []
    sm = s_arm.at(many) if many is not None else None
    cm = c_arm.at(many) if many is not None else None
    if sm is not None and not sm.too_few:
        falls = sm.cluster_share < s1.cluster_share
        kind = "many_falls" if falls else "many_stays"
        findings.append(Finding(kind, {"many": many, "share": sm.cluster_share}))
        if cm is not None and not cm.too_few:
            if cm.cluster_share < ABSENT_SHARE:
                findings.append(Finding("many_control_clear", {"share": cm.cluster_share}))
            else:
                # The control queues there too: a share above the fastest decile is no longer a
                # stall measure, so the verdict says so instead of claiming anything.
                findings.append(
                    Finding(
                        "many_control_queues",
                        {"share": cm.cluster_share, "suspect_p50_ms": sm.p50_ms,
                         "control_p50_ms": cm.p50_ms},
                    )
                )
    # The stall's size: how much slower the cluster is than the control's typical request
    # (the fastest decile would also count the ordinary spread of request times).
    delta = (None if s1.cluster_median_ms is None or c1.p50_ms is None
             else s1.cluster_median_ms - c1.p50_ms)
    common = {
        "single": single,
        "suspect_label": s_arm.label,
        "control_label": c_arm.label,
        "suspect": s1,
        "control": c1,
        "delta_ms": delta,
        "timer": _timer(delta),
    }
    if s1.cluster_share > REPRODUCED_SHARE and c1.cluster_share < ABSENT_SHARE:
        outcome, kind = "reproduced", "reproduced"
    elif s1.cluster_share >= ABSENT_SHARE:
        outcome, kind = "partly reproduced", "partly_reproduced"
    else:
        outcome, kind = "not reproduced", "not_reproduced"
    arm_findings = tuple(
        Finding(
            "arm",
            {"name": name, "label": res.label, "single": single, "single_stats": st,
             "many": many, "many_stats": res.at(many) if many is not None else None},
        )
        for name, res in arms.items()
        if (st := res.at(single)) is not None
    )
    return Verdict(outcome, Finding(kind, common), tuple(findings), arm_findings, facts)


def _relative(st: StallStats, ref: StallStats) -> str:
    """Is `ref`'s stall cluster "absent", "reduced" or "present" in `st`? Relative, so that a
    few noisy samples (2 of 30 is already 7%) do not count as the stall."""
    if st.cluster_share < max(ABSENT_SHARE, ref.cluster_share / 5):
        return "absent"
    if st.cluster_share >= ref.cluster_share / 2:
        return "present"
    return "reduced"


def external_verdict(
    arms: Mapping[str, ArmResult],
    *,
    reused: str = "reused",
    fresh: str = "fresh-connection",
    many_arm: str = "reused",
    nonstream: str = "non-streaming",
    gap_arms: Sequence[str] = (),
    single: int = 1,
    many: int = 32,
    facts: KernelFacts | None = None,
) -> Verdict:
    """Verdict of a probe on a stack the lab did not launch: the arms are traffic shapes."""
    r_arm = arms.get(reused)
    r1 = r_arm.at(single) if r_arm else None
    if r1 is None or r1.too_few:
        n = 0 if r1 is None else r1.n
        too_few = Finding("too_few_external", {"n": n, "needed": MIN_SAMPLES})
        return Verdict("too few samples", too_few)
    present = r1.has_cluster

    def _st(name: str, conc: int) -> StallStats | None:
        res = arms.get(name)
        st = res.at(conc) if res else None
        return None if st is None or st.too_few else st

    if present:
        # The stall's size: against the fast mode's median (the fresh-connection arm's when it
        # is stall-free, else the fast requests of this arm), not against the fastest decile.
        f1 = _st(fresh, single)
        if f1 is not None and _relative(f1, r1) == "absent":
            fast_ms, fast_ref = f1.p50_ms, "fresh_median"
        elif r1.fast_median_ms is not None:
            fast_ms, fast_ref = r1.fast_median_ms, "fast_median"
        else:
            fast_ms, fast_ref = r1.baseline_ms, "fastest_decile"
        assert r1.cluster_median_ms is not None and fast_ms is not None  # has_cluster
        delta = r1.cluster_median_ms - fast_ms
        headline = Finding(
            "stall_present",
            {"stats": r1, "delta_ms": delta, "fast_ref": fast_ref, "timer": _timer(delta)},
        )
    else:
        headline = Finding("no_stall", {"stats": r1})

    findings: list[Finding] = []
    lines: list[Finding] = []
    m = _st(many_arm, many)
    if m is not None:
        lines.append(Finding("shape", {"shape": "many", "many": many, "stats": m}))
        if present:
            values: dict[str, Any] = {"many": many, "share": m.cluster_share, "p50_ms": m.p50_ms,
                      "cluster_median_ms": r1.cluster_median_ms}
            if m.p50_ms is not None and r1.cluster_median_ms is not None and (
                m.p50_ms >= r1.cluster_median_ms
            ):
                findings.append(Finding("traffic_no_lower", values))
            elif m.cluster_share < VANISHED_SHARE:
                findings.append(Finding("traffic_vanishes", values))
            elif m.cluster_share < r1.cluster_share / 2:
                findings.append(Finding("traffic_shrinks", values))
            else:
                findings.append(Finding("traffic_persists", values))
    for shape, name in (("fresh", fresh), ("nonstream", nonstream)):
        st = _st(name, single)
        if st is None:
            continue
        lines.append(Finding("shape", {"shape": shape, "stats": st}))
        if present:
            findings.append(
                Finding(
                    f"{shape}_{_relative(st, r1)}",
                    {"reused_share": r1.cluster_share, "share": st.cluster_share},
                )
            )
    for g in gap_arms:
        st = _st(g, single)
        if st is None:
            continue
        label = arms[g].label
        lines.append(Finding("shape", {"shape": "gap", "label": label, "stats": st}))
        if not present:
            continue
        values = {"label": label, "share": st.cluster_share, "reused_share": r1.cluster_share}
        if st.cluster_share >= r1.cluster_share / 2:
            findings.append(Finding("gap_persists", values))
        elif st.cluster_share < ABSENT_SHARE:
            findings.append(Finding("gap_gone", values))
        else:
            findings.append(Finding("gap_reduced", values))
    outcome = "stall present" if present else "no stall"
    return Verdict(outcome, headline, tuple(findings), tuple(lines), facts)
