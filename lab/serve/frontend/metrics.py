"""The frontend's Prometheus metrics, written by hand (text exposition format 0.0.4).

Recording is a few integer updates per request and one histogram update per SSE event, so it
stays off the profile; rendering happens only when /metrics is scraped.

    lab_frontend_requests_total{endpoint,outcome,worker}  counter
    lab_frontend_inflight_requests                        gauge
    lab_frontend_worker_inflight_requests{worker}         gauge
    lab_frontend_workers{role}                            gauge (registered workers)
    lab_frontend_ttft_seconds{worker}                     histogram (received -> first token out)
    lab_frontend_inter_token_seconds{worker}              histogram (gap between two events divided
                                                          by the event's tokens, once per token)
    lab_frontend_output_tokens_total{worker}              counter

`worker` is the decode (or aggregated) worker id, "none" when no worker was reached.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable

TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
ITL_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
)


class Histogram:
    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += n
        self.sum += value * n
        self.count += n

    def render(self, name: str, labels: str, out: list[str]) -> None:
        sep = "," if labels else ""
        cumulative = 0
        for bound, c in zip(self.bounds, self.counts, strict=False):
            cumulative += c
            out.append(f'{name}_bucket{{{labels}{sep}le="{bound}"}} {cumulative}')
        out.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}')
        out.append(f"{name}_sum{{{labels}}} {self.sum:.6f}")
        out.append(f"{name}_count{{{labels}}} {self.count}")


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class FrontendMetrics:
    def __init__(self) -> None:
        self.requests: dict[tuple[str, str, str], int] = {}
        self.inflight = 0
        self.ttft: dict[str, Histogram] = {}
        self.itl: dict[str, Histogram] = {}
        self.tokens: dict[str, int] = {}

    def ttft_hist(self, worker: str) -> Histogram:
        hist = self.ttft.get(worker)
        if hist is None:
            hist = self.ttft[worker] = Histogram(TTFT_BUCKETS)
        return hist

    def itl_hist(self, worker: str) -> Histogram:
        hist = self.itl.get(worker)
        if hist is None:
            hist = self.itl[worker] = Histogram(ITL_BUCKETS)
        return hist

    def finished(self, endpoint: str, outcome: str, worker: str | None, tokens: int) -> None:
        key = (endpoint, outcome, worker or "none")
        self.requests[key] = self.requests.get(key, 0) + 1
        if tokens and worker:
            self.tokens[worker] = self.tokens.get(worker, 0) + tokens

    def render(
        self,
        worker_counts: dict[str, int],
        worker_inflight: Iterable[tuple[str, int]],
    ) -> str:
        out: list[str] = []
        add = out.append
        add("# HELP lab_frontend_requests_total Finished requests by endpoint, outcome and worker.")
        add("# TYPE lab_frontend_requests_total counter")
        for (endpoint, outcome, worker), n in sorted(self.requests.items()):
            add(
                f'lab_frontend_requests_total{{endpoint="{endpoint}",outcome="{outcome}",'
                f'worker="{_esc(worker)}"}} {n}'
            )
        add("# HELP lab_frontend_inflight_requests Requests being served.")
        add("# TYPE lab_frontend_inflight_requests gauge")
        add(f"lab_frontend_inflight_requests {self.inflight}")
        add("# HELP lab_frontend_worker_inflight_requests Requests in flight per worker.")
        add("# TYPE lab_frontend_worker_inflight_requests gauge")
        for worker, n in sorted(worker_inflight):
            add(f'lab_frontend_worker_inflight_requests{{worker="{_esc(worker)}"}} {n}')
        add("# HELP lab_frontend_workers Registered workers by role.")
        add("# TYPE lab_frontend_workers gauge")
        for role, n in sorted(worker_counts.items()):
            add(f'lab_frontend_workers{{role="{role}"}} {n}')
        add("# HELP lab_frontend_output_tokens_total Output tokens sent, per worker.")
        add("# TYPE lab_frontend_output_tokens_total counter")
        for worker, n in sorted(self.tokens.items()):
            add(f'lab_frontend_output_tokens_total{{worker="{_esc(worker)}"}} {n}')
        self._hists(out, "lab_frontend_ttft_seconds", "Time to first token.", self.ttft.items)
        self._hists(out, "lab_frontend_inter_token_seconds", "Inter-token latency.", self.itl.items)
        return "\n".join(out) + "\n"

    @staticmethod
    def _hists(
        out: list[str],
        name: str,
        help_text: str,
        items: Callable[[], Iterable[tuple[str, Histogram]]],
    ) -> None:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} histogram")
        for worker, hist in sorted(items(), key=lambda kv: kv[0]):
            hist.render(name, f'worker="{_esc(worker)}"', out)
