"""The server's own view of a `bench_aiperf` run, from vLLM's Prometheus `/metrics`.

Each client measures TTFT from its own stamps; vLLM's histograms
(`vllm:time_to_first_token_seconds`, `vllm:request_prefill_time_seconds`) measure the same
requests on the server, the same way for both tools, so a gap between the tools that the server
does not see is the clients'. A poller
reads `/metrics` from before a run to after it; the mean over the run's measured requests is
(sum at the end - sum at the first poll whose count had passed the run's warm-up) / (the count
difference). vLLM's counter `vllm:prefix_cache_hits` (tokens) tells whether a run's prefills
were cold.

The parsing and the arithmetic are pure functions (`parse_samples`, `mean_after_warmup`,
`increase`); `MetricsPoller` is the only part that touches the network (the stdlib's
urllib.request: the project does not depend on prometheus_client).
"""

from __future__ import annotations

import re
import threading
import urllib.error
import urllib.request
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

#: vLLM's histogram of time to first token, per request (seconds): `_sum` and `_count` samples.
TTFT = "vllm:time_to_first_token_seconds"
#: vLLM's histogram of the time a request spent in prefill (seconds).
PREFILL = "vllm:request_prefill_time_seconds"
#: vLLM's counter of prompt tokens served from its prefix cache: the sample name as
#: prometheus_client writes it (`_total`), and a bare one as older exporters do.
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits")
#: The samples a poll keeps; the rest of /metrics (buckets, other metrics) is skipped unparsed.
WATCHED = (f"{TTFT}_sum", f"{TTFT}_count", f"{PREFILL}_sum", f"{PREFILL}_count", *PREFIX_HITS)
#: Seconds between polls during a run: a few hundred polls over a run of a minute or two, each a
#: render of vLLM's registry on the server (small beside its per-request work at these rates).
POLL_INTERVAL_S = 0.2
#: Seconds one GET /metrics may take before that poll is skipped.
FETCH_TIMEOUT_S = 5.0

# name, optional {labels} (a quoted value may hold '}' or spaces), value, optional timestamp
_SAMPLE_RE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{.*\})?\s+(\S+)(?:\s+-?\d+)?\s*$")
_NAME_END_RE = re.compile(r"[{\s]")


def parse_samples(text: str, names: Collection[str] | None = None) -> dict[str, float]:
    """Prometheus text exposition -> {sample name: value summed over its label sets} (vLLM
    writes one series per engine and model_name). `names`: keep only these sample names (the
    lines of the others are not parsed). Comments and lines that are not samples are skipped."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if names is not None:
            end = _NAME_END_RE.search(line)
            if (line[:end.start()] if end else line) not in names:
                continue
        m = _SAMPLE_RE.match(line)
        if m is None:
            continue
        try:
            value = float(m.group(2))
        except ValueError:
            continue
        totals[m.group(1)] = totals.get(m.group(1), 0.0) + value
    return totals


def mean_after_warmup(snapshots: Sequence[Mapping[str, float]], histogram: str,
                      warmup: int) -> float | None:
    """A histogram's mean over the requests a run observed after its first `warmup` ones.

    snapshots[0] is a poll from before the run, snapshots[-1] one from after it. The run's
    measured requests start at the first poll whose `_count` reached snapshots[0]'s + warmup:
    (sum[-1] - sum[that poll]) / (count[-1] - count[that poll]). None when the histogram is
    missing or no request was observed after that poll."""
    count, total = f"{histogram}_count", f"{histogram}_sum"
    polls = [s for s in snapshots if count in s and total in s]
    if len(polls) < 2:
        return None
    reached = polls[0][count] + warmup
    start = next((s for s in polls if s[count] >= reached), None)
    if start is None:
        return None
    n = polls[-1][count] - start[count]
    return (polls[-1][total] - start[total]) / n if n > 0 else None


def increase(snapshots: Sequence[Mapping[str, float]], names: Sequence[str]) -> float | None:
    """How much the first of `names` present in the first snapshot grew from the first
    snapshot to the last; None when none of them is there."""
    if not snapshots:
        return None
    name = next((n for n in names if n in snapshots[0]), None)
    if name is None or name not in snapshots[-1]:
        return None
    return snapshots[-1][name] - snapshots[0][name]


@dataclass(frozen=True)
class ServerReading:
    """The server's view of one run: mean TTFT and prefill time over its measured requests (ms),
    and the prompt tokens its prefix cache served during the whole run (warm-up included)."""

    ttft_ms: float | None
    prefill_ms: float | None
    prefix_hit_tokens: float | None

    @classmethod
    def of(cls, snapshots: Sequence[Mapping[str, float]], warmup: int) -> ServerReading:
        def ms(histogram: str) -> float | None:
            mean = mean_after_warmup(snapshots, histogram, warmup)
            return None if mean is None else 1e3 * mean
        return cls(ms(TTFT), ms(PREFILL), increase(snapshots, PREFIX_HITS))


def fetch(metrics_url: str, timeout_s: float = FETCH_TIMEOUT_S) -> dict[str, float] | None:
    """One GET of `metrics_url`, parsed for WATCHED; None when it does not answer 200."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=timeout_s) as resp:
            text = resp.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return parse_samples(text, WATCHED)


def has_vllm_ttft(metrics_url: str) -> bool:
    """Whether the target publishes vLLM's TTFT histogram (not with --disable-log-stats, nor on
    servers that are not vLLM)."""
    sample = fetch(metrics_url)
    return sample is not None and f"{TTFT}_count" in sample


class MetricsPoller:
    """`with MetricsPoller(url) as p: run()`: polls `url` once on entry (before the run), every
    `interval_s` in a daemon thread while the run lasts, and once more on exit (after it);
    `p.snapshots` holds the polls that answered, in order."""

    def __init__(self, metrics_url: str, interval_s: float = POLL_INTERVAL_S) -> None:
        self.metrics_url = metrics_url
        self.interval_s = interval_s
        self.snapshots: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="metrics-poller", daemon=True)

    def _poll(self) -> None:
        sample = fetch(self.metrics_url)
        if sample is not None:
            self.snapshots.append(sample)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._poll()

    def __enter__(self) -> MetricsPoller:
        self._poll()
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._poll()
