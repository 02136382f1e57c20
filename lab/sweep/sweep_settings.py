"""`lab sweep`'s own settings (what to send, how long, what to report), defined once.

The click options of `lab sweep` are generated from `SweepSettings` (`@options(SweepSettings)`,
lab.shared.config_cli), the load client's from `lab.load.client_settings.ClientSettings`, and
the topology options come from `launch.cli_options`. A bad value is a usage error naming its
option; the cross-field checks (`--shared-prefix` within `--isl`, `--requests` or `--duration`)
are model validators, usage errors too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import psutil
from pydantic import model_validator

from lab.analysis.knee import DEFAULT_THRESHOLD as KNEE_THRESHOLD
from lab.analysis.slo_share import DEFAULT_SLO_SHARE
from lab.load.client_settings import MAX_CONCURRENCY
from lab.load.workload import (
    ENDPOINTS,
    LAB_PROMPT_KIND,
    PROMPT_KINDS,
    TARGET_PROMPT_KIND,
    WorkloadSpec,
)
from lab.open_loop.rate_search import AUTO_CONCURRENCY, MAX_LEVELS
from lab.shared.config_cli import MAX_SECONDS, MAX_SEED, Settings, setting
from launch.faults import FAULT_KINDS

_WORKLOAD = WorkloadSpec()
DEFAULT_CONC = (1, 32, 128, 256)
MAX_REQUESTS = 10_000_000
#: The longest prompt or output a request may ask for, in tokens.
MAX_SEQUENCE_TOKENS = 1 << 20
MAX_REPEAT = 1000
_FAULT_RE = re.compile(r"^(?P<proc>[A-Za-z0-9_.-]+):(?P<kind>[a-z-]+)@(?P<num>\d+(?:\.\d+)?)"
                       r"(?P<unit>ms|s)?$")


def parse_conc(value: str) -> list[int]:
    """'1,32,128' -> [1, 32, 128] (sorted, unique); ValueError saying what is wrong otherwise."""
    items = [v.strip() for v in str(value).split(",")]
    if not any(items):
        raise ValueError("expected a comma-separated list of positive integers, e.g. "
                         "1,32,128,256")
    if not all(items):
        raise ValueError(f"{value!r} has an empty item (expected e.g. 1,32,128,256)")
    out = []
    for item in items:
        try:
            n = int(item)
        except ValueError:
            raise ValueError(f"{item!r} is not an integer (expected e.g. 1,32,128,256)") from None
        if n < 1:
            raise ValueError(f"{n} is not a positive concurrency")
        if n > MAX_CONCURRENCY:
            raise ValueError(f"{n} exceeds the limit of {MAX_CONCURRENCY} requests in flight "
                             "(each holds a connection and its buffers)")
        out.append(n)
    return sorted(set(out))


def parse_conc_option(value: str) -> tuple[int, ...] | Literal["auto"]:
    """--conc: a list of concurrencies, or `auto` (search the SLO edge)."""
    return "auto" if str(value).strip() == "auto" else tuple(parse_conc(value))


def format_conc(levels: tuple[int, ...] | str) -> list[str]:
    return [levels if isinstance(levels, str) else ",".join(str(c) for c in levels)]


@dataclass(frozen=True)
class FaultSpec:
    process: str
    kind: str
    at_s: float

    def __str__(self) -> str:
        return f"{self.process}:{self.kind}@{self.at_s:g}s"


def parse_faults(values: tuple[str, ...]) -> list[FaultSpec]:
    """'engine-decode-0:kill@10s' (also @500ms, @10; several per option, comma-separated)."""
    out = []
    for value in values:
        for item in (v.strip() for v in value.split(",")):
            if not item:
                continue
            m = _FAULT_RE.match(item)
            if not m:
                raise ValueError(f"{item!r}: expected PROCESS:KIND@TIME, e.g. "
                                 "engine-decode-0:kill@10s")
            kind = m["kind"]
            if kind not in FAULT_KINDS:
                raise ValueError(f"{item!r}: unknown kind {kind!r} (kinds: "
                                 f"{', '.join(FAULT_KINDS)})")
            at = float(m["num"]) / (1000.0 if m["unit"] == "ms" else 1.0)
            out.append(FaultSpec(m["proc"], kind, at))
    return sorted(out, key=lambda f: f.at_s)


def format_faults(faults: tuple[FaultSpec, ...]) -> list[str]:
    return [str(f) for f in faults]


def parse_server_pids(values: tuple[str, ...]) -> dict[str, int]:
    """NAME=PID pairs of --server-pid; a clear error for a malformed pair or a missing pid."""
    out: dict[str, int] = {}
    for value in values:
        name, sep, pid = value.partition("=")
        if not sep or not name or not pid.isdigit():
            raise ValueError(f"{value!r}: expected NAME=PID, e.g. frontend=1234")
        if name in out:
            raise ValueError(f"{name!r} is given twice")
        if not psutil.pid_exists(int(pid)):
            raise ValueError(f"{value!r}: no process {pid}")
        out[name] = int(pid)
    return out


def format_server_pids(pids: dict[str, int]) -> list[str]:
    return [f"{name}={pid}" for name, pid in pids.items()]


def _slo_ms(what: str) -> Any:
    return setting(None, f"{what} SLO for goodput, in ms.", gt=0, le=MAX_SECONDS * 1000)


def _length_stddev(default: float, what: str) -> Any:
    return setting(default, f"Standard deviation of the {what} length (normal, clipped to "
                   ">= 1).", ge=0, le=MAX_SEQUENCE_TOKENS)


class SweepSettings(Settings):
    """The `lab sweep` command line, less the topology and load-client options."""

    conc: tuple[int, ...] | Literal["auto"] = setting(
        DEFAULT_CONC, "Concurrency levels (requests in flight), comma-separated. `auto` (with "
        "an --slo-*): find the highest concurrency at which --slo-share of the requests meet "
        f"every SLO, from c={AUTO_CONCURRENCY}, in at most --max-levels levels (bracket by "
        "doubling or halving, then bisect).", metavar="LIST|auto", parse=parse_conc_option,
        format=format_conc)
    isl: int = setting(
        _WORKLOAD.isl, "Input (prompt) tokens per request: exact in --tokenizer's tokenizer when "
        "given, else in the lab frontend's word tokenizer.", ge=1, le=MAX_SEQUENCE_TOKENS)
    osl: int = setting(
        _WORKLOAD.osl, "Output tokens per request (max_tokens = min_tokens, ignore_eos).", ge=1,
        le=MAX_SEQUENCE_TOKENS)
    isl_stddev: float = _length_stddev(_WORKLOAD.isl_stddev, "prompt")
    osl_stddev: float = _length_stddev(_WORKLOAD.osl_stddev, "output")
    requests: int | None = setting(
        None, "Measured requests per level.", ge=1, le=MAX_REQUESTS,
        default_text="max(100, 8 x concurrency)")
    duration: float | None = setting(
        None, "Run each level this long instead of a request count.", gt=0, le=MAX_SECONDS,
        metavar="SECONDS")
    warmup: int | None = setting(
        None, "Warm-up requests per level, excluded from statistics.", ge=0, le=MAX_REQUESTS,
        default_text="the level's concurrency")
    repeat: int = setting(
        1, "Run each level K times; the report shows the spread.", ge=1, le=MAX_REPEAT)
    seed: int = setting(
        _WORKLOAD.seed, "Workload seed (prompts and lengths are deterministic for a seed).", ge=0,
        le=MAX_SEED)
    shared_prefix: int = setting(
        _WORKLOAD.shared_prefix, "Tokens of prompt prefix shared by every request (prefix-cache "
        "hits).", ge=0, le=MAX_SEQUENCE_TOKENS, metavar="TOKENS")
    prompt_kind: str | None = setting(
        None, "Prompt form: token_ids (a list of ids; with --tokenizer, ids of its vocabulary), "
        "words (the lab word tokenizer's <token:N> words), or text (natural text; exactly "
        "--isl tokens with --tokenizer).", choices=PROMPT_KINDS,
        default_text=f"{TARGET_PROMPT_KIND} with --target or --tokenizer, else {LAB_PROMPT_KIND}")
    endpoint: str = setting(
        _WORKLOAD.endpoint, "OpenAI endpoint: /v1/completions or /v1/chat/completions (chat: "
        "the report states the server's chat-template overhead in prompt tokens).",
        choices=ENDPOINTS)
    out: Path | None = setting(
        None, "Run directory (must not exist or be empty).",
        default_text="results/<timestamp>-<name>", metavar="DIRECTORY")
    target: str | None = setting(
        None, "Sweep an external OpenAI-compatible server (nothing launched; use --model).",
        metavar="URL")
    server_pids: dict[str, int] = setting(
        {}, "With --target: sample this server process (and its children) for the report's "
        "server CPU, e.g. --server-pid frontend=1234 --server-pid engine=1240 (repeatable).",
        flag="--server-pid", multiple=True, metavar="NAME=PID", parse=parse_server_pids,
        format=format_server_pids)
    slo_ttft_ms: float | None = _slo_ms("TTFT")
    slo_latency_ms: float | None = _slo_ms("Latency")
    slo_itl_ms: float | None = _slo_ms("ITL")
    slo_share: float = setting(
        DEFAULT_SLO_SHARE, "With an --slo-* and --rate auto or --conc auto: the share of "
        "requests that must meet every SLO for a level to pass. 0.99 is a p99 objective, as "
        "users state SLOs; 1.0 would let one slow outlier end the search, 0.95 would pass a "
        "level where one user in twenty misses.", gt=0, le=1, metavar="SHARE")
    max_levels: int = setting(
        MAX_LEVELS, "--rate auto / --conc auto: run at most this many search levels (the "
        "closed-loop level of --rate auto not counted).", ge=2, le=100, metavar="N")
    ramp_up: float = setting(
        0.0, "Ramp each level up over this long before it is measured: a closed-loop level "
        "starts its slots spread over it, a rate level's rate grows linearly from 0. The "
        "requests sent during the ramp are recorded as warm-up, outside the measured window.",
        ge=0, le=MAX_SECONDS, metavar="SECONDS")
    knee_threshold: float = setting(
        KNEE_THRESHOLD, "Marginal-efficiency threshold of the knee rule (a step whose "
        "efficiency falls below it ends the sweep's useful range).", gt=0)
    compare_disagg: bool = setting(
        False, "Run the sweep aggregated, then disaggregated (--prefill/--decode), and compare "
        "them.")
    faults: tuple[FaultSpec, ...] = setting(
        (), "Inject a fault during the sweep, e.g. engine-decode-0:kill@10s (TIME from the "
        "first level's start; repeatable or comma-separated).", flag="--fault", multiple=True,
        metavar="PROC:KIND@TIME", parse=parse_faults, format=format_faults)
    no_plots: bool = setting(False, "Skip the PNG plots.")
    quiet: bool = setting(False, "No live progress lines.")

    @model_validator(mode="after")
    def _consistent(self) -> SweepSettings:
        if self.shared_prefix > self.isl:
            raise ValueError(f"--shared-prefix {self.shared_prefix} exceeds --isl {self.isl} "
                             "(the shared prefix is part of the prompt)")
        if self.requests is not None and self.duration is not None:
            raise ValueError("--requests and --duration are alternatives: give one")
        if self.conc == "auto" and not self.slos():
            raise ValueError("--conc auto searches the SLO edge: give at least one of "
                             "--slo-ttft-ms, --slo-latency-ms, --slo-itl-ms")
        return self

    @property
    def conc_levels(self) -> list[int]:
        """The given concurrency levels ([] with `--conc auto`: the search picks them)."""
        return [] if self.conc == "auto" else list(self.conc)

    def slos(self) -> dict[str, float]:
        """The goodput SLOs given, by metric (ttft_ms, latency_ms, itl_ms)."""
        given = {"ttft_ms": self.slo_ttft_ms, "latency_ms": self.slo_latency_ms,
                 "itl_ms": self.slo_itl_ms}
        return {k: v for k, v in given.items() if v is not None}
