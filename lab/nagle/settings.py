"""`lab nagle`'s command line as one settings model (lab.shared.config_cli).

The options it shares with `lab sweep` (--isl, --osl, --seed, --prompt-kind, --endpoint,
--target, --timeout) and with the topology (--speedup, --model, --tokenizer, --topology) are
those fields (`field_like`): the same bounds and spelling; only the help says what they mean
here where that differs.
"""

from __future__ import annotations

from pathlib import Path

import click
from pydantic import model_validator

from lab.load.client_settings import MAX_CONCURRENCY, ClientSettings
from lab.load.workload import WorkloadSpec
from lab.nagle.arms import (
    DEFAULT_EXTERNAL_GAP_MS,
    DEFAULT_MANY,
    DEFAULT_REQUESTS,
    EXTERNAL_ARMS,
    LAUNCHED_ARMS,
)
from lab.nagle.stats import DEFAULT_THRESHOLD_MS
from lab.shared.config_cli import MAX_SECONDS, Settings, field_like, run_value, setting
from lab.sweep.sweep_settings import MAX_REQUESTS, SweepSettings
from launch.topology import FleetSpec
from launch.topology_settings import TopologySettings

#: The probe's per-request timeout, seconds (shorter than a sweep's: the probe's requests are
#: small, and a stall it looks for is tens of ms).
DEFAULT_TIMEOUT_S = 60.0


class NagleSettings(Settings):
    """The `lab nagle` command line, and what the probe runs on: the command resolves the
    model, the target URL and the workload's defaults into one copy (`model_copy(update=)`)."""

    out: Path | None = field_like(SweepSettings, "out", help="Run directory.",
                                  default_text="results/<timestamp>-nagle")
    requests: int = setting(DEFAULT_REQUESTS, "Requests per arm and concurrency level.", ge=1,
                            le=MAX_REQUESTS)
    arms: str | None = setting(
        None, "Comma-separated arms, or 'all'. Launched stack: " + ", ".join(LAUNCHED_ARMS)
        + " [default: control,suspect]. With --target: " + ", ".join(EXTERNAL_ARMS)
        + " (reused always runs) [default: all].")
    gap_ms: str | None = setting(
        None, "Idle gaps between requests, ms, comma-separated: each value > 0 adds an arm at "
        "concurrency 1 (suspect settings on the launched stack, one reused connection with "
        f"--target). [default: 0; with --target {DEFAULT_EXTERNAL_GAP_MS:g}]")
    many: int = setting(DEFAULT_MANY, "The continuous-traffic concurrency level run beside "
                        "concurrency 1.", ge=2, le=MAX_CONCURRENCY)
    threshold_ms: float = setting(
        DEFAULT_THRESHOLD_MS, "A stall: TTFT at least this far above the fastest decile.",
        gt=0, le=MAX_SECONDS * 1000)
    speedup: float = field_like(
        FleetSpec, "speedup",
        help="Engine speedup of the launched stack (1000: the engine is nearly free).")
    isl: int = field_like(SweepSettings, "isl", help="Prompt tokens per request (exact in "
                          "--tokenizer's tokenizer when given).")
    osl: int = field_like(SweepSettings, "osl", help="Output tokens per request.")
    seed: int = field_like(SweepSettings, "seed", default=0, help="Workload seed.")
    warmup: int = setting(
        0, "Leading requests per level left out of the statistics (0: the first request of a "
        "fresh connection is part of the signature).", ge=0, le=MAX_REQUESTS)
    timeout_s: float = field_like(ClientSettings, "timeout", default=DEFAULT_TIMEOUT_S,
                                  help="Per-request timeout, seconds.", flag="--timeout")
    endpoint: str = field_like(SweepSettings, "endpoint")
    prompt_kind: str | None = field_like(SweepSettings, "prompt_kind")
    tokenizer: str | None = field_like(
        TopologySettings, "tokenizer", help="A HuggingFace tokenizer.json or local model "
        "directory (no hub access): prompts of exactly --isl tokens in it; the launched stack's "
        "frontend tokenizes with it too.",
        default_text="none: the lab frontend's word tokenizer")
    target: str | None = field_like(
        SweepSettings, "target", help="Base URL of a running OpenAI-compatible server (e.g. "
        "http://127.0.0.1:8000): nothing is launched and the arms become traffic shapes. One "
        "probe request checks it first.", metavar=None)
    model: str | None = field_like(
        TopologySettings, "model", help="Model name. With --target: the server's only model "
        "when /v1/models lists one, else required.")
    topology: Path | None = field_like(
        TopologySettings, "topology", help="Launch each arm on this TOML topology (e.g. fleets "
        "on network hosts, see launch/topology.py) instead of one aggregated engine; each arm "
        "changes only the socket settings. --speedup is then the file's.",
        path=click.Path(path_type=Path, dir_okay=False, exists=True))
    reanalyse_dir: Path | None = setting(
        None, "Send nothing: recompute nagle.json, plots and report.md of an earlier probe's "
        "run directory from its requests.parquet (with --threshold-ms if given).",
        flag="--reanalyse", path=click.Path(path_type=Path, file_okay=False, exists=True))

    include_usage: bool = run_value(
        True, "False: the target refused stream_options.include_usage (the --target probe).")

    def workload(self, stream: bool = True) -> WorkloadSpec:
        """The probe's requests (streaming or not, as the arm asks)."""
        return WorkloadSpec(isl=self.isl, osl=self.osl, seed=self.seed, stream=stream,
                            prompt_kind=self.prompt_kind or WorkloadSpec.prompt_kind,
                            endpoint=self.endpoint, tokenizer=self.tokenizer,
                            include_usage=self.include_usage)

    @model_validator(mode="after")
    def _warmup_below_requests(self) -> NagleSettings:
        if self.reanalyse_dir is None and self.warmup >= self.requests:
            raise ValueError(f"--warmup {self.warmup} must be below --requests "
                             f"({self.requests})")
        return self
