"""The Nagle verdict: is there a delayed-ACK stall cluster in single-stream TTFT, and where?

Statistics for one set of TTFT samples (one arm, one concurrency level):

- ``baseline``: the fastest decile (p10) of the samples. When nearly every request stalls, the
  p10 itself lies inside the cluster, so two things can lower it: when the sorted samples have a
  gap of at least ``threshold_ms``, the p10 of the samples below the widest such gap (e.g. the
  first request of each fresh connection, fast before the connection turned idle-slow); and a
  reference passed in by the caller (a probe passes, per concurrency level, the fastest decile
  of the fastest arm at that level: same load, one setting apart). The lowest is the baseline.
- the **stall cluster**: samples at least ``threshold_ms`` (default 30 ms) above the baseline;
  its share and its median.
- **bimodality**, gap based: both the fast part (below the cluster floor) and the cluster hold at
  least 5% of the samples, and the modes are clearly apart: the cluster's own p10 lies at least
  ``threshold_ms / 2`` above the fast part's p90 (a few in-between samples on a busy machine do
  not hide two modes; a spread-out unimodal distribution has no such gap). Sarle's bimodality
  coefficient b = (skew^2 + 1) / (excess kurtosis + 3(n-1)^2 / ((n-2)(n-3))) is reported beside it
  (b > 5/9 hints at bimodality) but does not decide: it reads a single far outlier as a second
  mode, which the share condition rules out.
- fewer than 30 samples: "too few samples", no verdict.

The shape of one distribution is one of ``too-few``, ``unimodal`` (cluster < 5%), ``bimodal``,
``stalled`` (>= 95% in the cluster: only possible against a reference baseline), ``spread``
(a cluster of 5-95% without a clear gap).

The delayed-ACK timer: Linux delays an ACK by at least TCP_DELACK_MIN = HZ/25 jiffies = 40 ms
(TCP_ATO_MIN, the same at every HZ); a socket enters delayed-ACK "pingpong" mode after
``net.ipv4.tcp_pingpong_thresh`` quick replies (1 on the machines the lab was built on).
A cluster whose excess over the baseline is near 40 ms (or a multiple, when two stalls stack) is
consistent with Nagle waiting for a delayed ACK.
"""

from __future__ import annotations

import gzip
import math
import platform
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

DEFAULT_THRESHOLD_MS = 30.0
MIN_SAMPLES = 30
MODE_MIN_SHARE = 0.05  # each mode of a bimodal distribution holds at least this share
STALLED_SHARE = 0.95  # a cluster at least this big: the whole distribution stalls
REPRODUCED_SHARE = 0.5  # the suspect arm's cluster holds more than this: reproduced
ABSENT_SHARE = 0.05  # a cluster below this share counts as absent
VANISHED_SHARE = 0.05
DELACK_MIN_MS = 40.0  # TCP_DELACK_MIN / TCP_ATO_MIN = HZ/25 jiffies
NEAR_TIMER_TOLERANCE_MS = 12.0
SARLE_BIMODAL = 5.0 / 9.0


@dataclass(frozen=True)
class StallStats:
    """Stall-cluster statistics of one TTFT sample set (all times in ms)."""

    n: int
    threshold_ms: float
    shape: str  # too-few | unimodal | bimodal | stalled | spread
    min_ms: float | None = None
    p10_ms: float | None = None
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    mean_ms: float | None = None
    baseline_ms: float | None = None
    cluster_floor_ms: float | None = None
    cluster_n: int = 0
    cluster_share: float = 0.0
    cluster_median_ms: float | None = None
    cluster_excess_ms: float | None = None  # cluster median - baseline
    fast_median_ms: float | None = None
    mode_gap_ms: float | None = None  # cluster p10 - fast part p90
    sarle_b: float | None = None

    @property
    def too_few(self) -> bool:
        return self.shape == "too-few"

    @property
    def bimodal(self) -> bool:
        return self.shape == "bimodal"

    @property
    def has_cluster(self) -> bool:
        return not self.too_few and self.cluster_share >= ABSENT_SHARE

    def to_dict(self) -> dict:
        return {**asdict(self), "bimodal": self.bimodal, "too_few": self.too_few}


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q, method="linear"))


def sarle_bimodality(values: Sequence[float]) -> float | None:
    """Sarle's bimodality coefficient with the sample skewness and excess kurtosis (n >= 4)."""
    x = np.asarray(values, dtype=float)
    n = x.size
    if n < 4:
        return None
    m = x.mean()
    d = x - m
    m2 = float(np.mean(d**2))
    if m2 <= 0:
        return None
    m3 = float(np.mean(d**3))
    m4 = float(np.mean(d**4))
    g1 = m3 / m2**1.5
    g2 = m4 / m2**2 - 3.0
    # bias-corrected sample skewness and excess kurtosis (as SAS / Sarle use)
    skew = g1 * math.sqrt(n * (n - 1)) / (n - 2)
    kurt = ((n + 1) * g2 + 6) * (n - 1) / ((n - 2) * (n - 3))
    return (skew**2 + 1) / (kurt + 3 * (n - 1) ** 2 / ((n - 2) * (n - 3)))


def _fast_baseline(x: np.ndarray, threshold_ms: float) -> float:
    """The p10 of sorted `x`, or, when a gap of at least `threshold_ms` splits it, the p10 of
    the samples below the widest gap (lower of the two)."""
    base = _pct(x, 10)
    if x.size >= 2:
        gaps = np.diff(x)
        i = int(np.argmax(gaps))
        if gaps[i] >= threshold_ms:
            base = min(base, _pct(x[: i + 1], 10))
    return base


def fast_baseline(
    ttft_ms: Sequence[float], threshold_ms: float = DEFAULT_THRESHOLD_MS
) -> float | None:
    """The fastest decile as stall_stats measures it (None without samples)."""
    x = np.asarray([v for v in ttft_ms if v is not None], dtype=float)
    x = np.sort(x[~np.isnan(x)])
    return _fast_baseline(x, threshold_ms) if x.size else None


def stall_stats(
    ttft_ms: Sequence[float],
    *,
    threshold_ms: float = DEFAULT_THRESHOLD_MS,
    baseline_ms: float | None = None,
    min_samples: int = MIN_SAMPLES,
) -> StallStats:
    """Stall-cluster statistics of `ttft_ms` (NaN and None values are dropped).

    `baseline_ms`: a reference fastest decile (e.g. the control arm's); the lower of it and this
    set's own p10 is used.
    """
    x = np.asarray([v for v in ttft_ms if v is not None], dtype=float)
    x = np.sort(x[~np.isnan(x)])
    n = int(x.size)
    if n == 0:
        return StallStats(n=0, threshold_ms=threshold_ms, shape="too-few")
    p10 = _pct(x, 10)
    base = _fast_baseline(x, threshold_ms)
    if baseline_ms is not None:
        base = min(base, baseline_ms)
    floor = base + threshold_ms
    cluster = x[x >= floor]
    fast = x[x < floor]
    share = cluster.size / n
    cluster_median = float(np.median(cluster)) if cluster.size else None
    gap = None
    if cluster.size and fast.size:
        gap = _pct(cluster, 10) - _pct(fast, 90)
    common = dict(
        n=n,
        threshold_ms=threshold_ms,
        min_ms=float(x[0]),
        p10_ms=p10,
        p50_ms=_pct(x, 50),
        p90_ms=_pct(x, 90),
        p99_ms=_pct(x, 99),
        max_ms=float(x[-1]),
        mean_ms=float(x.mean()),
        baseline_ms=base,
        cluster_floor_ms=floor,
        cluster_n=int(cluster.size),
        cluster_share=share,
        cluster_median_ms=cluster_median,
        cluster_excess_ms=None if cluster_median is None else cluster_median - base,
        fast_median_ms=float(np.median(fast)) if fast.size else None,
        mode_gap_ms=gap,
        sarle_b=sarle_bimodality(x),
    )
    if n < min_samples:
        shape = "too-few"
    elif share < MODE_MIN_SHARE:
        shape = "unimodal"
    elif share >= STALLED_SHARE:
        shape = "stalled"
    elif share <= 1 - MODE_MIN_SHARE and gap is not None and gap >= threshold_ms / 2:
        shape = "bimodal"
    else:
        shape = "spread"
    return StallStats(shape=shape, **common)


# --- the kernel's delayed-ACK facts -------------------------------------------------------------


@dataclass(frozen=True)
class KernelFacts:
    system: str
    release: str
    hz: int | None
    pingpong_thresh: int | None
    delack_min_ms: float = DELACK_MIN_MS

    def sentence(self) -> str:
        if self.system != "Linux":
            return f"{self.system} {self.release}: the Linux delayed-ACK facts do not apply as such"
        parts = [f"Linux {self.release}"]
        if self.hz:
            parts.append(f"HZ={self.hz}")
        parts.append(f"minimum delayed ACK {self.delack_min_ms:.0f} ms (HZ/25 jiffies)")
        if self.pingpong_thresh is not None:
            parts.append(f"net.ipv4.tcp_pingpong_thresh={self.pingpong_thresh}")
        return ", ".join(parts)

    def to_dict(self) -> dict:
        return {**asdict(self), "sentence": self.sentence()}


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _kernel_hz(release: str) -> int | None:
    """CONFIG_HZ from /proc/config.gz or /boot/config-<release>, if readable."""
    candidates = [Path("/proc/config.gz"), Path(f"/boot/config-{release}")]
    for path in candidates:
        try:
            if path.suffix == ".gz":
                text = gzip.decompress(path.read_bytes()).decode(errors="replace")
            else:
                text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("CONFIG_HZ="):
                try:
                    return int(line.split("=", 1)[1])
                except ValueError:
                    return None
    return None


def kernel_facts() -> KernelFacts:
    system, release = platform.system(), platform.release()
    if system != "Linux":
        return KernelFacts(system=system, release=release, hz=None, pingpong_thresh=None)
    return KernelFacts(
        system=system,
        release=release,
        hz=_kernel_hz(release),
        pingpong_thresh=_read_int(Path("/proc/sys/net/ipv4/tcp_pingpong_thresh")),
    )


def near_timer(excess_ms: float | None, timer_ms: float = DELACK_MIN_MS) -> int | None:
    """How many delayed-ACK timers (1 or 2) the cluster's excess matches, or None."""
    if excess_ms is None:
        return None
    for k in (1, 2):
        if abs(excess_ms - k * timer_ms) <= NEAR_TIMER_TOLERANCE_MS:
            return k
    return None


# --- arms and verdicts ---------------------------------------------------------------------------


@dataclass
class ArmResult:
    """One arm's stats per concurrency level; `label` says in words what the arm changes."""

    arm: str
    label: str
    levels: dict[int, StallStats] = field(default_factory=dict)

    def at(self, concurrency: int) -> StallStats | None:
        return self.levels.get(concurrency)

    def to_dict(self) -> dict:
        return {
            "arm": self.arm,
            "label": self.label,
            "levels": {str(c): s.to_dict() for c, s in sorted(self.levels.items())},
        }


@dataclass(frozen=True)
class Verdict:
    # reproduced | partly reproduced | not reproduced | stall present | no stall | too few samples
    outcome: str
    text: str
    lines: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"outcome": self.outcome, "text": self.text, "lines": list(self.lines)}


def arm_results(
    samples: Mapping[str, Mapping[int, Sequence[float]]],
    labels: Mapping[str, str] | None = None,
    *,
    threshold_ms: float = DEFAULT_THRESHOLD_MS,
    independent: Sequence[str] = (),
) -> dict[str, ArmResult]:
    """Stats for every arm and level; each level against the fastest arm at that level.

    At each concurrency level the baseline is the lowest fastest decile among the arms at that
    level: an arm that stalls on nearly every request would otherwise hide its cluster in its
    own p10, and arms at the same concurrency share the same queueing, so a slower fastest
    decile there is not counted as a stall. Arms named in `independent` (e.g. non-streaming,
    whose "TTFT" is the full response time) are measured against themselves only and do not
    set the others' baseline.
    """
    labels = labels or {}
    refs: dict[int, float] = {}
    for arm, levels in samples.items():
        if arm in independent:
            continue
        for conc, vals in levels.items():
            b = fast_baseline(vals, threshold_ms)
            if b is not None:
                refs[conc] = b if conc not in refs else min(refs[conc], b)
    out: dict[str, ArmResult] = {}
    for arm, levels in samples.items():
        res = ArmResult(arm=arm, label=labels.get(arm, arm))
        for conc, vals in sorted(levels.items()):
            ref = None if arm in independent else refs.get(conc)
            res.levels[conc] = stall_stats(vals, threshold_ms=threshold_ms, baseline_ms=ref)
        out[arm] = res
    return out


def _pctw(share: float) -> str:
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
        f"{_pctw(stats.cluster_share)} in a {stats.cluster_median_ms:.1f} ms cluster "
        f"({stats.cluster_excess_ms:.1f} ms above the fastest decile, {stats.shape})"
    )


def _timer_clause(
    stats: StallStats, facts: KernelFacts | None, excess_ms: float | None = None
) -> str:
    k = near_timer(stats.cluster_excess_ms if excess_ms is None else excess_ms)
    kernel = f"; {facts.sentence()}" if facts else ""
    if k == 1:
        return f"the delayed-ACK timer{kernel}"
    if k == 2:
        return f"two delayed-ACK timers stacked{kernel}"
    return f"not near the {DELACK_MIN_MS:.0f} ms delayed-ACK timer{kernel}"


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
    control (NODELAY on, coalesced), with a line per other arm."""
    c_arm, s_arm = arms.get(control), arms.get(suspect)
    c1 = c_arm.at(single) if c_arm else None
    s1 = s_arm.at(single) if s_arm else None
    if c1 is None or s1 is None:
        missing = control if c1 is None else suspect
        return Verdict(
            "not reproduced", f"cannot decide: arm {missing!r} has no concurrency-{single} samples"
        )
    if c1.too_few or s1.too_few:
        return Verdict(
            "too few samples",
            f"too few samples: {s1.n} ({suspect}) and {c1.n} ({control}) concurrency-{single} "
            f"requests, need >= {MIN_SAMPLES}",
        )
    many_clause = ""
    sm = s_arm.at(many) if (many is not None and s_arm) else None
    cm = c_arm.at(many) if (many is not None and c_arm) else None
    if sm is not None and not sm.too_few:
        verb = "falls to" if sm.cluster_share < s1.cluster_share else "stays at"
        many_clause = f"; at concurrency {many} the cluster {verb} {_pctw(sm.cluster_share)}"
        if cm is not None and not cm.too_few:
            if cm.cluster_share < ABSENT_SHARE:
                many_clause += f" (control: {_pctw(cm.cluster_share)})"
            else:
                # the control queues there too: a share above the fastest decile is no longer
                # a stall measure, so say so instead of claiming anything
                many_clause += (
                    f", but the control's is {_pctw(cm.cluster_share)} too (TTFT p50 "
                    f"{sm.p50_ms:.1f} vs {cm.p50_ms:.1f} ms): at that level requests queue, "
                    "and the probe cannot tell a stall from queueing there"
                )
    s_label, c_label = s_arm.label, c_arm.label
    # the stall's size: how much slower the cluster is than the control's typical request
    # (the fastest decile would also count the ordinary spread of request times)
    delta = None if s1.cluster_median_ms is None else s1.cluster_median_ms - c1.p50_ms
    if s1.cluster_share > REPRODUCED_SHARE and c1.cluster_share < ABSENT_SHARE:
        outcome = "reproduced"
        text = (
            f"reproduced: with {s_label}, {_pctw(s1.cluster_share)} of concurrency-{single} "
            f"requests wait in a {s1.cluster_median_ms:.1f} ms cluster "
            f"({delta:.1f} ms above the control's median: "
            f"{_timer_clause(s1, facts, delta)}); "
            f"with {c_label}, {_pctw(c1.cluster_share)}{many_clause}"
        )
    elif s1.cluster_share >= ABSENT_SHARE:
        outcome = "partly reproduced"
        text = (
            f"partly reproduced: with {s_label}, {describe(s1)} "
            f"({_timer_clause(s1, facts, delta)}); with {c_label}, {describe(c1)}{many_clause}"
        )
    else:
        outcome = "not reproduced"
        text = (
            f"not reproduced: with {s_label}, {describe(s1)} (p50 {s1.p50_ms:.1f} ms); "
            f"with {c_label}, {describe(c1)} (p50 {c1.p50_ms:.1f} ms){many_clause}"
        )
    lines = []
    for name, res in arms.items():
        st = res.at(single)
        if st is None:
            continue
        line = f"{name} ({res.label}): concurrency {single}: {describe(st)}"
        if many is not None and (m := res.at(many)) is not None:
            line += f"; concurrency {many}: {describe(m)}"
        lines.append(line)
    return Verdict(outcome, text, tuple(lines))


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
        return Verdict(
            "too few samples",
            f"too few samples: {n} single-stream requests on a reused connection, "
            f"need >= {MIN_SAMPLES}",
        )
    lines: list[str] = []
    present = r1.has_cluster

    def _st(name: str, conc: int) -> StallStats | None:
        res = arms.get(name)
        st = res.at(conc) if res else None
        return None if st is None or st.too_few else st

    if present:
        # the stall's size: against the fast mode's median (the fresh-connection arm's when it
        # is stall-free, else the fast requests of this arm), not against the fastest decile
        f1 = _st(fresh, single)
        if f1 is not None and _relative(f1, r1) == "absent":
            fast_ms, fast_what = f1.p50_ms, "the fresh-connection median"
        elif r1.fast_median_ms is not None:
            fast_ms, fast_what = r1.fast_median_ms, "the fast requests' median"
        else:
            fast_ms, fast_what = r1.baseline_ms, "the fastest decile"
        delta = r1.cluster_median_ms - fast_ms
        head = (
            f"stall present: {_pctw(r1.cluster_share)} of single-stream requests on one reused "
            f"connection wait in a {r1.cluster_median_ms:.1f} ms cluster "
            f"({delta:.1f} ms above {fast_what}, {r1.cluster_excess_ms:.1f} ms above the "
            f"fastest decile; distribution {r1.shape}; {_timer_clause(r1, facts, delta)})"
        )
    else:
        head = (
            f"no stall: single-stream TTFT on one reused connection is {r1.shape} "
            f"(p10 {r1.p10_ms:.1f} ms, p50 {r1.p50_ms:.1f} ms, p99 {r1.p99_ms:.1f} ms), "
            f"{_pctw(r1.cluster_share)} of requests >= {r1.threshold_ms:.0f} ms above "
            "the fastest decile"
        )
        if facts:
            head += f" ({facts.sentence()})"

    findings: list[str] = []
    m = _st(many_arm, many)
    if m is not None:
        lines.append(f"concurrency {many}: {describe(m)}")
        if present and m.p50_ms is not None and r1.cluster_median_ms is not None and (
            m.p50_ms >= r1.cluster_median_ms
        ):
            findings.append(
                f"under continuous traffic (concurrency {many}) TTFT p50 is {m.p50_ms:.1f} ms, "
                f"no lower than the single-stream cluster ({r1.cluster_median_ms:.1f} ms): "
                "either the stall persists there (e.g. per-connection delayed ACK with one "
                "request per connection) or queueing hides it"
            )
        elif present:
            if m.cluster_share < VANISHED_SHARE:
                findings.append(
                    f"it vanishes under continuous traffic (concurrency {many}: "
                    f"{_pctw(m.cluster_share)}), as a delayed-ACK stall does (other requests' "
                    "traffic carries the ACK) and as engine queueing would not"
                )
            elif m.cluster_share < r1.cluster_share / 2:
                findings.append(
                    f"it shrinks under continuous traffic "
                    f"(concurrency {many}: {_pctw(m.cluster_share)})"
                )
            else:
                findings.append(
                    f"it persists under continuous traffic "
                    f"(concurrency {many}: {_pctw(m.cluster_share)}): per-connection delayed ACK "
                    "with one request per connection, or not a network stall"
                )
    f = _st(fresh, single)
    if f is not None:
        lines.append(f"fresh connection per request: {describe(f)}")
        rel = _relative(f, r1) if present else None
        both = f"({_pctw(r1.cluster_share)} vs {_pctw(f.cluster_share)})"
        if rel == "absent":
            findings.append(
                f"present on a reused connection and absent on fresh ones {both}: consistent "
                "with the client-facing HTTP connection's state (the server's response path "
                "writing headers and the first chunk separately without TCP_NODELAY, meeting "
                "the client's delayed ACK on a kept-alive connection), not with the engine"
            )
        elif rel == "present":
            findings.append(
                f"present on fresh connections too {both}: the client's HTTP connection is not "
                "the cause; consistent with a persistent connection behind the frontend (its "
                "request plane to the workers) or with the engine"
            )
        elif rel == "reduced":
            findings.append(f"reduced on fresh connections {both}: partly per-connection")
    ns = _st(nonstream, single)
    if ns is not None:
        lines.append(f"non-streaming (TTFT = full response time): {describe(ns)}")
        rel = _relative(ns, r1) if present else None
        both = f"({_pctw(r1.cluster_share)} vs {_pctw(ns.cluster_share)})"
        if rel == "absent":
            findings.append(
                f"present when streaming and absent when not {both}: points at the streaming "
                "response path (one small write per event) rather than at the engine"
            )
        elif rel == "present":
            findings.append(
                f"present without streaming too {both}: not specific to the SSE response path"
            )
        elif rel == "reduced":
            findings.append(f"reduced without streaming {both}")
    for g in gap_arms:
        st = _st(g, single)
        if st is None:
            continue
        res = arms[g]
        lines.append(f"{res.label}: {describe(st)}")
        if not present:
            continue
        if st.cluster_share >= r1.cluster_share / 2:
            findings.append(
                f"with {res.label}: still {_pctw(st.cluster_share)} (idle time does not end "
                "it, as it does not end delayed-ACK pingpong mode)"
            )
        elif st.cluster_share < ABSENT_SHARE:
            findings.append(
                f"with {res.label}: gone ({_pctw(st.cluster_share)}): idle time ends it"
            )
        else:
            findings.append(
                f"with {res.label}: reduced to {_pctw(st.cluster_share)} "
                f"(back to back: {_pctw(r1.cluster_share)})"
            )
    text = head
    if findings:
        text += "; " + "; ".join(findings)
    outcome = "stall present" if present else "no stall"
    return Verdict(outcome, text, tuple(lines))
