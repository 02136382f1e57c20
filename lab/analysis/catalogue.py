"""The metric catalogue: every figure of a level, defined once (docs/metrics.md "The metric
catalogue").

One `Metric` per figure, AIPerf-style: its name, unit, what it is derived from, which statistics
levels.csv keeps of it, what it means, and which way is better. Every view reads it: the columns
of levels.csv (`lab.analysis.metrics.level_summary`, `lab.open_loop.figures`), the report's
tables (`lab.report.markdown`), `lab compare`'s table (`lab.analysis.compare`), `lab fidelity`'s
metrics (`lab.fidelity.gaps.METRICS`) and the table in docs/metrics.md (checked row by row by
tests/analysis/test_catalogue.py; `python -m lab.analysis.catalogue` prints it).

Before it, a column name such as "ttft_ms_p50" was spelled in each view, and each view built
its own list. Adding a metric is one `_define(Metric(...))` entry here (then the code that
computes its value, and the docs row the test asks for).

A metric with statistics is a family of levels.csv columns, `<name>_<stat>` (`ttft_ms_p50`);
one without is a single column, `<name>` (`req_s`). The names are the users' contract (their
scripts read levels.csv): they never change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

#: The statistics a per-request figure can be described by (lab.analysis.stats.describe).
STATS = ("avg", "std", "min", "p50", "p90", "p95", "p99", "max")
Better = Literal["lower", "higher", "neither"]
#: How a statistic is named in a table heading ("TTFT mean (ms)"); the others as they are.
STAT_WORDS = {"avg": "mean"}


@dataclass(frozen=True)
class Metric:
    """One figure of a level (one levels.csv column, or one column per statistic)."""

    name: str  # the levels.csv column, or the prefix of its statistic columns
    label: str  # how tables name it ("TTFT", "req/s")
    unit: str  # "ms", "req/s", "" for a ratio or a count
    source: str  # what it is derived from (a per-request column, a file, other figures)
    description: str
    stats: tuple[str, ...] = ()  # the statistics levels.csv keeps (lab.analysis.stats.STATS)
    better: Better = "lower"  # which way a delta is an improvement (`lab compare`)
    digits: int = 2  # decimals in the report's tables
    open_loop: bool = False  # only an open-loop (--rate) level has it

    def __post_init__(self) -> None:
        unknown = [s for s in self.stats if s not in STATS]
        if unknown:
            raise ValueError(f"metric {self.name}: unknown statistics {unknown} (known: {STATS})")

    def col(self, stat: str | None = None) -> Column:
        """The column of one statistic (None: the metric's one value)."""
        if (stat is None) != (not self.stats) or (stat is not None and stat not in self.stats):
            kept = ", ".join(self.stats) or "none: it is one value"
            raise KeyError(f"metric {self.name} has no statistic {stat!r} (it keeps {kept})")
        return Column(self, stat)

    def columns(self) -> tuple[Column, ...]:
        """Every levels.csv column of the metric, in levels.csv order."""
        return tuple(Column(self, s) for s in self.stats) if self.stats else (Column(self),)

    def values(self, stats: Mapping[str, float | None]) -> dict[str, float | None]:
        """The metric's columns of a levels.csv row from `stats` (lab.analysis.stats.describe)."""
        return {c.name: stats[c.stat] for c in self.columns() if c.stat is not None}


@dataclass(frozen=True)
class Column:
    """One levels.csv column: a metric and one of its statistics (None: its one value)."""

    metric: Metric
    stat: str | None = None

    @property
    def name(self) -> str:
        return self.metric.name if self.stat is None else f"{self.metric.name}_{self.stat}"

    @property
    def heading(self) -> str:
        """'TTFT p50 (ms)', 'TTFT mean (ms)', 'goodput (req/s)'; a label that ends with its unit
        ('req/s', 'out tok/s') stands alone."""
        m = self.metric
        text = m.label if self.stat is None else f"{m.label} {self.stat_word}"
        return text if not m.unit or m.label.endswith(m.unit) else f"{text} ({m.unit})"

    @property
    def stat_word(self) -> str:
        return "" if self.stat is None else STAT_WORDS.get(self.stat, self.stat)

    def judge(self, delta_pct: float, negligible_pct: float) -> str:
        """'better' or 'worse' for a change of `delta_pct` %, '' when the metric has no better
        direction or the change is below `negligible_pct`."""
        if self.metric.better == "neither" or abs(delta_pct) < negligible_pct:
            return ""
        return "better" if (delta_pct > 0) == (self.metric.better == "higher") else "worse"


CATALOGUE: dict[str, Metric] = {}


def _define(metric: Metric) -> Metric:
    if metric.name in CATALOGUE:
        raise ValueError(f"metric {metric.name} is defined twice")
    CATALOGUE[metric.name] = metric
    return metric


def metric(name: str) -> Metric:
    """The metric called `name` (KeyError naming the known ones when there is none)."""
    try:
        return CATALOGUE[name]
    except KeyError:
        raise KeyError(f"no metric {name!r} (known: {', '.join(CATALOGUE)})") from None


# ----- throughput and errors, per level -----
ERROR_RATE = _define(Metric(
    "error_rate", "error rate", "", "failed and successful requests",
    "failed / (succeeded + failed), warm-up excluded"))
DURATION = _define(Metric(
    "duration_s", "measured duration", "s", "sent_ns, end_ns",
    "last response of the level - first request sent in the level (warm-up excluded)",
    better="neither"))
REQ_S = _define(Metric(
    "req_s", "req/s", "req/s", "successful requests, measured duration",
    "request throughput: successful requests / measured duration", better="higher", digits=1))
OUT_TOK_S = _define(Metric(
    "out_tok_s", "out tok/s", "tok/s", "output_tokens of successful requests",
    "output token throughput: their output tokens / measured duration", better="higher",
    digits=0))
TOKENS_PER_CHUNK = _define(Metric(
    "tokens_per_chunk", "tok/chunk", "tok/chunk", "output_tokens, chunks",
    "output tokens per content chunk: above the stream interval, some hop merged engine steps",
    better="neither"))

# ----- per-request distributions (lab.analysis.request_times) -----
TTFT = _define(Metric(
    "ttft_ms", "TTFT", "ms", "ttft_ms of successful requests",
    "time to first token: first content chunk - request sent", stats=STATS))
TTST = _define(Metric(
    "ttst_ms", "TTST", "ms", "ttst_ms of successful requests",
    "time to second token: second content chunk - first content chunk",
    stats=("avg", "p50", "p99")))
LATENCY = _define(Metric(
    "latency_ms", "latency", "ms", "latency_ms of successful requests",
    "request latency: last content chunk - request sent", stats=STATS, digits=1))
ITL = _define(Metric(
    "itl_ms", "ITL", "ms", "itl_ms of successful requests",
    "inter-token latency per request: (latency - TTFT) / (output tokens - 1)",
    stats=("avg", "p50", "p99"), digits=3))
GAP = _define(Metric(
    "gap_ms", "chunk gap", "ms", "chunk_times_ns of successful requests",
    "every gap between consecutive content chunks, pooled over requests",
    stats=("avg", "p50", "p99", "max"), digits=3))
SEND_DELAY = _define(Metric(
    "send_delay_ms", "send delay", "ms", "send_delay_ms of every measured request",
    "request sent - request scheduled: the client's own delay", stats=("p50", "p99", "max")))
TTFR = _define(Metric(
    "ttfr_ms", "TTFR", "ms", "ttfr_ms of successful requests that streamed reasoning",
    "time to first reasoning token: first reasoning chunk - request sent",
    stats=("p50", "p99")))
TTFO = _define(Metric(
    "ttfo_ms", "TTFO", "ms", "ttfo_ms of successful requests",
    "time to first output (answer) token: first answer chunk - request sent",
    stats=("p50", "p99")))
REASONING_CHUNKS = _define(Metric(
    "reasoning_chunks_mean", "reasoning chunks", "", "reasoning_chunks of successful requests",
    "mean reasoning-only chunks per request", better="neither", digits=1))
ANSWER_CHUNKS = _define(Metric(
    "answer_chunks_mean", "answer chunks", "", "chunks - reasoning_chunks",
    "mean answer chunks per request", better="neither", digits=1))
SLO_GOOD = _define(Metric(
    "slo_good", "SLO-good requests", "", "ttft_ms, latency_ms, itl_ms, --slo-*-ms",
    "measured requests that succeeded and met every given SLO (only with an SLO)",
    better="higher", digits=0))
SLO_SHARE = _define(Metric(
    "slo_share", "SLO share", "", "slo_good / measured requests",
    "share of measured requests meeting every given SLO; a failed request misses "
    "(only with an SLO)", better="higher", digits=4))
SLO_SHARE_LO = _define(Metric(
    "slo_share_lo", "SLO share low", "", "slo_good, measured requests",
    "lower end of the SLO share's 95% Wilson interval", better="higher", digits=4))
SLO_SHARE_HI = _define(Metric(
    "slo_share_hi", "SLO share high", "", "slo_good, measured requests",
    "upper end of the SLO share's 95% Wilson interval", better="higher", digits=4))
GOODPUT = _define(Metric(
    "goodput_req_s", "goodput", "req/s", "ttft_ms, latency_ms, itl_ms, --slo-*-ms",
    "requests meeting every given SLO / measured duration (only with an SLO)",
    better="higher", digits=1))

# ----- the open loop (lab.open_loop.figures, docs/open-loop.md) -----
SCHEDULE_REQ_S = _define(Metric(
    "schedule_req_s", "schedule req/s", "req/s", "intended_ns",
    "the drawn schedule's own rate: (n - 1) / span of the intended sends", better="neither",
    digits=1, open_loop=True))
SENT_REQ_S = _define(Metric(
    "sent_req_s", "sent req/s", "req/s", "sent_ns",
    "the rate the client sent: (n - 1) / span of the actual sends", better="higher", digits=1,
    open_loop=True))
COMPLETED_REQ_S = _define(Metric(
    "completed_req_s", "completed req/s", "req/s", "end_ns of successful requests",
    "the rate requests completed: (k - 1) / span of their response ends", better="higher",
    digits=1, open_loop=True))
SENT_FRACTION = _define(Metric(
    "sent_fraction", "sent fraction", "", "sent_req_s, schedule_req_s",
    "sent rate / schedule rate (the offered rate without a schedule)", better="higher",
    open_loop=True))
DISPATCH_LAG = _define(Metric(
    "dispatch_lag_ms", "dispatch lag", "ms", "send_delay_ms of every measured request",
    "actual send - release (release = intended unless held)", stats=("p50", "p99", "max"),
    digits=3, open_loop=True))
HELD = _define(Metric(
    "held", "held", "requests", "held_ms",
    "requests that waited at the client under --max-concurrency", digits=0, open_loop=True))
HELD_MS = _define(Metric(
    "held_ms", "held", "ms", "held_ms of the held requests",
    "release - intended: the wait under --max-concurrency", stats=("p99", "max"),
    open_loop=True))
GROWTH_FIRST = _define(Metric(
    "latency_growth_first_ms", "latency (intended) first third p50", "ms",
    "latency_intended_ms of successful requests, in intended-send order",
    "median latency from the intended send over the level's first third", better="neither",
    open_loop=True))
GROWTH_LAST = _define(Metric(
    "latency_growth_last_ms", "latency (intended) last third p50", "ms",
    "latency_intended_ms of successful requests, in intended-send order",
    "the same over the last third: sustained when at most 25% + 1 ms above the first",
    better="neither", open_loop=True))
SUSTAINED = _define(Metric(
    "sustained", "sustained", "", "completed_req_s, latency growth",
    "1 when the stack sustained the rate; the mean over repeats is the share that did",
    better="higher", digits=0, open_loop=True))
TTFT_INTENDED = _define(Metric(
    "ttft_intended_ms", "TTFT (intended)", "ms", "ttft_intended_ms of successful requests",
    "first content chunk - request intended: corrected for coordinated omission",
    stats=("avg", "p50", "p90", "p99", "max"), open_loop=True))
LATENCY_INTENDED = _define(Metric(
    "latency_intended_ms", "latency (intended)", "ms",
    "latency_intended_ms of successful requests",
    "last content chunk - request intended: corrected for coordinated omission",
    stats=("avg", "p50", "p90", "p99", "max"), digits=1, open_loop=True))

# ----- the client's health (client.json, lab.analysis.client_health) -----
CLIENT_PROCS = _define(Metric(
    "client_procs", "client processes", "", "client.json",
    "load client processes of the level", better="neither", digits=0))
CLIENT_CPU_PCT = _define(Metric(
    "client_cpu_pct", "client CPU", "%", "client.json",
    "the client's CPU, summed over its processes (% of one core)", digits=0))
CLIENT_CPU_PCT_MAX_PROC = _define(Metric(
    "client_cpu_pct_max_proc", "busiest client process", "%", "client.json",
    "the busiest client process's CPU (% of one core): 90% or more, the client is the bottleneck",
    digits=0))
CLIENT_CPU_MS_PER_REQ = _define(Metric(
    "client_cpu_ms_per_req", "client CPU", "ms/req", "client.json",
    "the client's CPU per request"))
LOOP_LAG_P99 = _define(Metric(
    "loop_lag_p99_ms", "loop lag p99", "ms", "client.json",
    "p99 of the client's event-loop lag: its stamps are late by up to it"))
LOOP_LAG_MAX = _define(Metric(
    "loop_lag_max_ms", "loop lag max", "ms", "client.json",
    "the largest event-loop lag of the client"))

# ----- CPU (procs.parquet and client.json, lab.analysis.metrics) -----
SERVER_CPU_PCT = _define(Metric(
    "server_cpu_pct", "server CPU", "%", "procs.parquet",
    "the sampled server processes' CPU over the level's window, summed (% of one core)",
    digits=0))
SERVER_CPU_WAIT_PCT = _define(Metric(
    "server_cpu_wait_pct", "server CPU wait", "%", "procs.parquet",
    "the sampled server processes' run-queue wait over the level's window, summed (% of one "
    "core): time their threads were runnable but waited for a CPU (/proc schedstat)",
    digits=0))
SERVER_CPU_MS_PER_REQ = _define(Metric(
    "server_cpu_ms_per_req", "server CPU", "ms/req", "procs.parquet, successful requests",
    "the server processes' CPU per successful request"))
SERVER_CPU_US_PER_TOKEN = _define(Metric(
    "server_cpu_us_per_token", "server CPU", "us/token", "procs.parquet, output tokens",
    "the server processes' CPU over the window per output token of its requests", digits=0))
CLIENT_CPU_US_PER_TOKEN = _define(Metric(
    "client_cpu_us_per_token", "client CPU", "us/token", "client.json, output tokens",
    "the client's CPU (warm-up included) per output token of all successful requests",
    digits=0))
TOTAL_CPU_US_PER_TOKEN = _define(Metric(
    "total_cpu_us_per_token", "total CPU", "us/token",
    "server_cpu_us_per_token, client_cpu_us_per_token",
    "the whole machine's CPU per output token: server + client", digits=0))


def catalogue_markdown() -> str:
    """The table of docs/metrics.md "The metric catalogue", one row per metric."""
    lines = ["| metric | levels.csv column | statistics | unit | derived from | better | "
             "description |", "|---|---|---|---|---|---|---|"]
    for m in CATALOGUE.values():
        column = f"`{m.name}_<stat>`" if m.stats else f"`{m.name}`"
        scope = " (open loop)" if m.open_loop else ""
        lines.append(f"| {m.label}{scope} | {column} | {', '.join(m.stats) or '-'} | "
                     f"{m.unit or '-'} | {m.source} | {m.better} | {m.description} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(catalogue_markdown())
