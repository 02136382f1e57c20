"""`lab sweep --trace` and `lab trace synth` options, defined once (the click options come from
here; docs/open-loop.md "Trace replay")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lab.load.trace import MOONCAKE_BLOCK_SIZE
from lab.load.trace_synth import SynthSpec
from lab.open_loop.arrival_settings import MAX_RATE, parse_arrival
from lab.open_loop.arrivals import ArrivalProcess
from lab.shared.config_cli import MAX_SEED, Settings, setting

#: The longest prompt or output a synthetic request may have, in tokens.
MAX_TRACE_TOKENS = 1 << 20
MAX_TRACE_SPEED = 1000.0
MAX_TRACE_REQUESTS = 10_000_000
MAX_PREFIX_GROUPS = 1_000_000


def _block_size(help_tail: str = "") -> Any:
    return setting(MOONCAKE_BLOCK_SIZE, "Tokens per hash_ids block (mooncake: 512)." + help_tail,
                   ge=1, le=MAX_TRACE_TOKENS, metavar="TOKENS")


class TraceSettings(Settings):
    """Trace replay: requests at a trace's times, prompts sharing the trace's blocks."""

    trace: Path | None = setting(
        None, "Replay a mooncake JSONL trace (timestamp ms, input_length, output_length, "
        "hash_ids) instead of --conc/--rate: each request is sent at its time, and equal "
        "hash_ids blocks are equal tokens, so prefix caches hit as the trace says.",
        metavar="FILE")
    trace_speed: float = setting(
        1.0, "With --trace: replay at this many times the trace's speed (2 = twice as fast).",
        gt=0, le=MAX_TRACE_SPEED, metavar="X")
    trace_block_size: int = _block_size()


class TraceSynthSettings(Settings):
    """`lab trace synth`: what the synthetic trace looks like."""

    out: Path = setting(None, "The trace file to write (JSONL).", required=True, metavar="FILE")
    requests: int = setting(100, "Requests in the trace.", ge=1, le=MAX_TRACE_REQUESTS)
    rate: float = setting(10.0, "Mean arrival rate, requests/s.", gt=0, le=MAX_RATE)
    arrival: str = setting("poisson", "Arrival process: poisson, gamma:CV or constant.",
                           parse=parse_arrival, metavar="poisson|gamma:CV|constant")
    isl: int = setting(2048, "Mean prompt tokens.", ge=1, le=MAX_TRACE_TOKENS)
    osl: int = setting(128, "Mean output tokens.", ge=1, le=MAX_TRACE_TOKENS)
    isl_stddev: float = setting(0.0, "Standard deviation of the prompt length.", ge=0,
                                le=MAX_TRACE_TOKENS)
    osl_stddev: float = setting(0.0, "Standard deviation of the output length.", ge=0,
                                le=MAX_TRACE_TOKENS)
    prefix_groups: int = setting(
        4, "Shared prefixes: each request starts with one of them (0: no reuse).", ge=0,
        le=MAX_PREFIX_GROUPS)
    prefix_blocks: int = setting(
        2, "Blocks in each shared prefix.", ge=0, le=MAX_TRACE_TOKENS)
    block_size: int = _block_size()
    seed: int = setting(0, "Seed: the same seed writes the same trace.", ge=0, le=MAX_SEED)

    def spec(self) -> SynthSpec:
        return SynthSpec(requests=self.requests, rate=self.rate,
                         arrival=ArrivalProcess.parse(self.arrival), isl=self.isl, osl=self.osl,
                         isl_stddev=self.isl_stddev, osl_stddev=self.osl_stddev,
                         prefix_groups=self.prefix_groups, prefix_blocks=self.prefix_blocks,
                         block_size=self.block_size, seed=self.seed)
