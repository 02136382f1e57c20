"""The designed probe set of `lab calibrate` and how it is run against a URL.

Three families, each a closed-loop level of `lab.load.sweep.SweepRunner` in its own
sub-directory of the run (`probes/<name>/`, laid out like a `lab sweep` run):

* ``context``: concurrency 1 at each prompt length of `context_isl`: its TTFT is the path plus
  the prefill of that many tokens (plus the first token's decode step), its ITL is one decode
  step at about `isl + osl / 2` KV tokens;
* ``batch``: the concurrency levels of `batch_conc` at each of `batch_isl`: the mean gap between
  streamed tokens, without the passes that held a prefill, is one decode step at about
  `concurrency x (isl + osl / 2)` KV tokens;
* ``overlap``: concurrency 2 at each prompt length of `context_isl`, output lengths spread
  (`osl_stddev`) so that the two streams fall out of step: a gap of one stream during which
  the other's first token arrived is a pass that held that prompt's prefill; minus the
  stream's plain gaps, it is the engine's prefill time alone, without any HTTP or routing path
  (which the other stream does not wait for);
* ``prefix``: concurrency 1 sending one prompt again and again (`shared_prefix = isl`): its TTFT
  beside the ``context`` probe of the same length shows whether the target caches prefixes.

Every probe has its own workload seed, so no two probes share a prompt prefix (a prefix cache
must not make one probe's prefill cheaper than it is).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lab.load.client_settings import ClientSettings
from lab.load.sweep import LineProgress, SweepPlan, SweepRunner
from lab.load.workload import WorkloadSpec

#: The last length fills two passes of vLLM's CPU budget (2048 tokens), so that a chunk that
#: attends to the one before it is measured. For a target whose budget is larger, add that
#: length to --context-isl (the fit report warns when the lengths do not fill one pass).
DEFAULT_CONTEXT_ISL = (64, 256, 1024, 4096)
DEFAULT_CONTEXT_OSL = 32


def default_context_isl(budget: int, max_model_len: int | None,
                        osl: int = DEFAULT_CONTEXT_OSL) -> tuple[int, ...]:
    """DEFAULT_CONTEXT_ISL, plus the pass budget when it is longer (a prompt that fills one
    pass) and the target's context length holds it with its output."""
    lengths = set(DEFAULT_CONTEXT_ISL)
    if budget > max(lengths) and (max_model_len is None or budget + osl <= max_model_len):
        lengths.add(budget)
    return tuple(sorted(lengths))

DEFAULT_CONTEXT_REQUESTS = 8
#: Batch sizes crossed with context lengths: a decode step's cost depends on both (the
#: sequences that share it and the KV tokens they attend to; docs/fidelity.md). 4 and 16 place
#: where a real engine's step stops being flat (the linear model's weight_bound_rows: 4 to 9
#: sequences for vLLM on this machine's CPU, docs/references.md).
DEFAULT_BATCH_CONC = (1, 4, 8, 16, 32, 64, 128)
DEFAULT_BATCH_ISL = (64, 1024)  # the second reaches the KV of long prompts at high concurrency
DEFAULT_BATCH_OSL = 128
DEFAULT_BATCH_ROUNDS = 2
#: A decode probe prefills concurrency x ISL tokens per round; past this many it is left out
#: (ISL 1024 at c=64 and c=128 cost 60 s and 100 s of a CPU engine's time, and c=32 already
#: reaches the KV tokens of the held-out workloads).
MAX_BATCH_PREFILL_TOKENS = 32_768
DEFAULT_PREFIX_ISL = 1024
DEFAULT_OVERLAP_OSL = 64
DEFAULT_OVERLAP_REQUESTS = 16
KINDS = ("context", "overlap", "batch", "prefix")


@dataclass(frozen=True)
class Probe:
    """One probe: a closed-loop level of `requests` requests (after `warmup`) at `concurrency`."""

    kind: str  # one of KINDS
    isl: int
    osl: int
    concurrency: int
    requests: int
    warmup: int
    seed: int  # the workload seed: distinct per probe
    #: prompt tokens the target adds to each request's ISL (its tokenizer's BOS: vLLM's
    #: completions), lab/fidelity/target_engine.py `added_prompt_tokens`
    added: int = 0

    @property
    def name(self) -> str:
        return f"{self.kind}-isl{self.isl}-osl{self.osl}-c{self.concurrency}"

    @property
    def tokens(self) -> int:
        """Prompt tokens the target computes per request: the ISL and what it adds."""
        return self.isl + self.added

    @property
    def decode_kv_tokens(self) -> float:
        """Active KV tokens of a typical decode step of this probe: each of the `concurrency`
        requests holds its prompt plus, on average, half its output."""
        return self.concurrency * (self.tokens + self.osl / 2.0)


@dataclass(frozen=True)
class ProbeSet:
    context_isl: tuple[int, ...] = DEFAULT_CONTEXT_ISL
    context_osl: int = DEFAULT_CONTEXT_OSL
    context_requests: int = DEFAULT_CONTEXT_REQUESTS
    batch_conc: tuple[int, ...] = DEFAULT_BATCH_CONC
    batch_isl: tuple[int, ...] = DEFAULT_BATCH_ISL
    batch_osl: int = DEFAULT_BATCH_OSL
    batch_rounds: int = DEFAULT_BATCH_ROUNDS  # measured requests per level = rounds x conc
    prefix_isl: int | None = DEFAULT_PREFIX_ISL  # None: no prefix probe
    overlap_osl: int | None = DEFAULT_OVERLAP_OSL  # None: no overlap probes
    overlap_requests: int = DEFAULT_OVERLAP_REQUESTS
    added: int = 0  # prompt tokens the target adds to the ISL (Probe.added)

    def probes(self) -> list[Probe]:
        out: list[Probe] = []
        seed = 1000
        for isl in self.context_isl:
            seed += 1
            out.append(Probe("context", isl, self.context_osl, 1, self.context_requests, 1,
                             seed, self.added))
        if self.overlap_osl is not None:
            for isl in self.context_isl:
                seed += 1
                out.append(Probe("overlap", isl, self.overlap_osl, 2, self.overlap_requests, 2,
                                 seed, self.added))
        for isl in self.batch_isl:
            for c in self.batch_conc:
                seed += 1
                if c * isl > MAX_BATCH_PREFILL_TOKENS and c > min(self.batch_conc):
                    continue
                out.append(Probe("batch", isl, self.batch_osl, c,
                                 max(self.batch_rounds * c, self.context_requests), c, seed,
                                 self.added))
        if self.prefix_isl is not None:
            seed += 1
            out.append(Probe("prefix", self.prefix_isl, self.context_osl, 1,
                             self.context_requests, 1, seed, self.added))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}


@dataclass
class ProbeResult:
    """What one probe measured (medians over its measured requests, and the decode step; ms)."""

    probe: Probe
    ttft_ms_p50: float
    itl_ms_p50: float
    decode_step_ms: float  # the mean token gap without prefill passes (decode_step_ms())
    latency_ms_p50: float
    ok: int
    failed: int
    cached_tokens_mean: float | None = None
    prefill_gap_ms: float = math.nan  # overlap probes: prefill_gap_ms()
    admission_wait_ms: float = math.nan  # overlap probes: admission_wait_ms()
    run_dir: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "probe"}
        d["probe"] = {**self.probe.__dict__, "name": self.probe.name}
        return d


def _num(v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f


def decode_step_ms(requests: pd.DataFrame) -> float:
    """The engine's decode pass of a probe, from the client's chunk stamps (ms).

    Per measured request: the mean of the gaps between its consecutive tokens, leaving out
    every gap whose pass held another request's prefill and a first-token burst (`_lead`). A
    mean within a stream, not a median: when the serving path lags, tokens arrive in bursts
    (a long gap, then near-zero ones) and only their sum keeps the engine's time. Then the
    median over requests, so one request slowed by a neighbour's CPU burst does not move it."""
    if requests.empty or "chunk_times_ns" not in requests:
        return math.nan
    per_request = []
    for gaps, at_first, held, _ in _stream_gaps(requests):
        use = (at_first == 0) & (held == 0)
        use[: _lead(gaps)] = False
        if use.any():
            per_request.append(float(gaps[use].mean()) / 1e6)
    return float(np.median(per_request)) if per_request else math.nan


#: a gap shorter than the engine's shortest step (timing.DECODE_FLOOR_MS) is no pass
BURST_GAP_NS = 1_000_000


def _lead(gaps: np.ndarray) -> int:
    """How many leading gaps of a stream are not engine passes: where the serving path held
    the first token back (a first-token floor), the tokens produced meanwhile arrive with it
    in one burst, and the gap after the burst is the rest of a pass that was running when the
    hold ended. 0 for a stream without such a burst.

    The burst is the longest run of leading gaps whose mean is shorter than any step, not the
    run of gaps each shorter than one: on a loaded machine one token of a burst can be a
    millisecond or two late (the first token's event costs the path more than the next), and
    a burst cut there leaves its sub-millisecond rest to pass for decode steps, a step many
    times too short."""
    if not gaps.size:
        return 0
    mean = np.cumsum(gaps) / np.arange(1, gaps.size + 1)
    below = np.flatnonzero(mean < BURST_GAP_NS)
    if not below.size:
        return 0
    return min(int(below[-1]) + 2, gaps.size)


def _stream_gaps(requests: pd.DataFrame
                 ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Per measured request: (its token gaps in ns, per gap how many other requests' first
    tokens its pass produced, per gap how many other requests' prefills it held, per held
    prefill how long after that request was sent its pass began, ns).

    Another request B is prefilled in a pass between B's send and its first token. Its first
    token comes from the same pass end as one of this stream's tokens (which of the two the
    client reads first is chance), unless the serving path holds B's first token back (a
    first-token floor, docs/fidelity.md): then the prefill pass lies earlier. So the held pass
    is the longest gap among those ending after B was sent and no later than this stream's
    token nearest B's first token: without a floor that window is the one or two gaps of B's
    path and prefill, with one it reaches back over the held time. A B sent before this
    stream's own first-token burst ended is left out (its pass may be inside the burst).

    Under many streams a request's prefill is chunked over several passes and its window is
    long: the longest gap in it is one of them, the pass at its first token another, and both
    are left out of the decode step (`decode_step_ms`); the prefill estimate of the two-stream
    overlap probe uses the window's (`prefill_gap_ms`)."""
    ok = requests[requests["ok"].astype(bool)]
    sent = pd.to_numeric(ok["sent_ns"], errors="coerce") if "sent_ns" in ok else None
    first = pd.to_numeric(ok["first_ns"], errors="coerce")
    keep = first.notna() if sent is None else first.notna() & sent.notna()
    firsts = first[keep].to_numpy(dtype=np.int64)
    sents = (sent[keep].to_numpy(dtype=np.int64) if sent is not None else firsts)
    out = []
    for row in ok[~ok["warmup"].astype(bool)].itertuples():
        t = np.asarray(row.chunk_times_ns if row.chunk_times_ns is not None else [],
                       dtype=np.int64)
        if t.size < 2:
            continue
        gaps = np.diff(t)
        half_last = gaps[-1] // 2
        inside = (firsts > t[0]) & (firsts <= t[-1] + half_last)
        others, their_sends = firsts[inside], sents[inside]
        idx = np.clip(np.searchsorted(t, others), 1, t.size - 1)
        nearer_left = (others - t[idx - 1]) < (t[idx] - others)
        end = np.where(nearer_left & (idx > 1), idx - 1, idx)  # the token ending the pass
        # the earliest token that may end the prefill pass: the first one after B was sent
        start = np.clip(np.searchsorted(t, their_sends, side="right"), 1, end)
        lead = _lead(gaps)
        pairs = [(s - 1 + int(np.argmax(gaps[s - 1:e])), b)
                 for s, e, b in zip(start, end, their_sends, strict=True) if s > lead]
        held = np.asarray([h for h, _ in pairs], dtype=np.int64)
        # the held pass began about when this stream's token before it arrived
        waits = np.asarray([t[h] - b for h, b in pairs], dtype=np.int64)
        at_first = np.bincount(end - 1, minlength=gaps.size)[: gaps.size]
        hits = np.bincount(held, minlength=gaps.size)[: gaps.size]
        out.append((gaps, at_first, hits, waits))
    return out


def prefill_gap_ms(requests: pd.DataFrame) -> float:
    """The engine's prefill of one prompt, seen from another stream (ms): the median gap that
    held exactly one other request's first token, minus the median of the streams' plain
    gaps. NaN when no gap held one (the streams stayed in step)."""
    if requests.empty or "chunk_times_ns" not in requests:
        return math.nan
    held, plain = [], []
    for gaps, at_first, hits, _ in _stream_gaps(requests):
        plain_gap = (hits == 0) & (at_first == 0)
        plain_gap[: _lead(gaps)] = False
        held.extend(gaps[hits == 1].tolist())
        plain.extend(gaps[plain_gap].tolist())
    if not held or not plain:
        return math.nan
    return (float(np.median(held)) - float(np.median(plain))) / 1e6


def admission_wait_ms(requests: pd.DataFrame) -> float:
    """How long after a request was sent the engine began the pass that held its prefill,
    seen from another stream (ms, the median): the serving path in, and the wait for a pass
    to start. In a closed loop the request is sent just after a pass ended, so this shows
    whether it joined the next pass or one after (`lab.fidelity.placement`). NaN when no
    stream saw another's prefill."""
    if requests.empty or "chunk_times_ns" not in requests:
        return math.nan
    waits = [w for *_, ws in _stream_gaps(requests) for w in ws.tolist()]
    return float(np.median(waits)) / 1e6 if waits else math.nan


def workload_of(probe: Probe, base: WorkloadSpec) -> WorkloadSpec:
    return replace(base, isl=probe.isl, osl=probe.osl, isl_stddev=0.0,
                   osl_stddev=probe.osl / 4.0 if probe.kind == "overlap" else 0.0,
                   seed=probe.seed, shared_prefix=probe.isl if probe.kind == "prefix" else 0)


async def run_probe(probe: Probe, url: str, model: str, base: WorkloadSpec, out_dir: Path,
                    client: ClientSettings, progress: LineProgress) -> ProbeResult:
    """Run one probe as a one-level sweep into `out_dir` and read its medians back."""
    out_dir.mkdir(parents=True, exist_ok=False)
    plan = SweepPlan(concurrency=[probe.concurrency], workload=workload_of(probe, base),
                     requests=probe.requests, warmup=probe.warmup, client=client)
    runner = SweepRunner(out_dir, url, model, plan, progress=progress)
    await runner.run()
    from lab.analysis import rundir

    levels = rundir.read_json(out_dir / "levels.json", [])
    row = levels[0] if levels else {}
    requests = rundir.read_requests(out_dir)
    return ProbeResult(
        probe=probe, ttft_ms_p50=_num(row.get("ttft_ms_p50")),
        itl_ms_p50=_num(row.get("itl_ms_p50")),
        decode_step_ms=decode_step_ms(requests),
        prefill_gap_ms=prefill_gap_ms(requests) if probe.kind == "overlap" else math.nan,
        admission_wait_ms=(admission_wait_ms(requests) if probe.kind == "overlap"
                           else math.nan),
        latency_ms_p50=_num(row.get("latency_ms_p50")), ok=int(row.get("ok") or 0),
        failed=int(row.get("failed") or 0),
        cached_tokens_mean=(None if row.get("cached_tokens_mean") is None
                            else _num(row.get("cached_tokens_mean"))),
        run_dir=str(out_dir))


async def run_probes(probes: list[Probe], url: str, model: str, base: WorkloadSpec,
                     out_dir: Path, client: ClientSettings, progress: LineProgress,
                     say: Callable[[str], None],
                     after: Callable[[Probe], Awaitable[None]] | None = None
                     ) -> list[ProbeResult]:
    """Every probe in order (one line before each), into `out_dir/<probe name>/`; `after(probe)`
    runs right after each (the lab-path measurement, alternated with the target's probes so
    that both see the same machine load)."""
    results = []
    for i, probe in enumerate(probes, start=1):
        say(f"probe {i}/{len(probes)}: {probe.name} ({probe.requests} requests)")
        results.append(await run_probe(probe, url, model, base, out_dir / probe.name, client,
                                       progress))
        if after is not None:
            await after(probe)
    return results
