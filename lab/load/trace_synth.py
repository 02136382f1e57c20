"""`lab trace synth`: a mooncake-format trace with chosen arrivals, lengths and prefix reuse.

For tests and for users without a trace of their own. Arrivals come from the open loop's
arrival processes (`lab.open_loop.arrivals`: poisson, gamma:CV, constant); lengths are normal around
the asked mean (clipped to >= 1), as `lab sweep`'s; prefix reuse is `prefix_groups` shared
prefixes of `prefix_blocks` blocks each: every request starts with one of them (drawn uniformly)
and continues with blocks of its own, so the trace's reuse is about
prefix_blocks * block_size / isl of the prompt tokens, less the first request of each group.
Everything is a function of the seed.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from lab.load.trace import MOONCAKE_BLOCK_SIZE, TraceRequest
from lab.open_loop.arrivals import ArrivalProcess


@dataclass(frozen=True)
class SynthSpec:
    requests: int = 100
    rate: float = 10.0
    arrival: ArrivalProcess = field(default_factory=ArrivalProcess)
    isl: int = 2048
    osl: int = 128
    isl_stddev: float = 0.0
    osl_stddev: float = 0.0
    prefix_groups: int = 4
    prefix_blocks: int = 2
    block_size: int = MOONCAKE_BLOCK_SIZE
    seed: int = 0


def _length(rng: random.Random, mean: int, stddev: float) -> int:
    return mean if stddev <= 0 else max(1, round(rng.gauss(mean, stddev)))


def synth_trace(spec: SynthSpec) -> list[TraceRequest]:
    """The trace of `spec`: requests in send order, timestamps in ms from 0."""
    offsets = spec.arrival.schedule_ns(spec.rate, spec.requests, [spec.seed, 0])
    rng = random.Random(f"trace-synth/{spec.seed}")
    next_own = spec.prefix_groups * spec.prefix_blocks  # hash ids past the shared prefixes
    out = []
    t0 = int(offsets[0]) if len(offsets) else 0
    for offset in offsets:
        isl = _length(rng, spec.isl, spec.isl_stddev)
        osl = _length(rng, spec.osl, spec.osl_stddev)
        blocks = math.ceil(isl / spec.block_size)
        ids: list[int] = []
        if spec.prefix_groups and spec.prefix_blocks:
            g = rng.randrange(spec.prefix_groups)
            ids = [g * spec.prefix_blocks + k for k in range(min(spec.prefix_blocks, blocks))]
        own = blocks - len(ids)
        ids.extend(range(next_own, next_own + own))
        next_own += own
        out.append(TraceRequest(round((int(offset) - t0) / 1e6, 3), isl, osl, tuple(ids)))
    return out
