"""One client's share of an open-loop level's schedule, when N clients split it (`--shard I/N`).

Every shard draws the level's whole schedule and request bodies from the same seed, then keeps
the arrivals `arrivals.split_streams` gives it: a seeded uniform split of the arrivals over N,
the same function and seed that split a level over `--client-procs N` processes. A random split
of a Poisson process is N independent Poisson processes of rate/N, and the N shards' arrivals
together are the seed's schedule, request for request, whatever N is. Shard I's records keep the
level's own request indices, so merged shards index the level like one unsharded client.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lab.load.workload import LazyRequests
from lab.open_loop.arrivals import split_streams


@dataclass(frozen=True)
class StreamShare:
    """Shard `index` of `count` clients splitting each open-loop level."""

    index: int
    count: int

    def pick(self, n: int, seed: Sequence[int]) -> np.ndarray:
        """The level indices (ascending) of this shard's arrivals among the level's `n`."""
        return np.flatnonzero(split_streams(n, self.count, seed) == self.index)

    def inner_seed(self, seed: Sequence[int]) -> list[int]:
        """The seed that splits this shard's arrivals over its own `--client-procs`: another
        stream than the one that split the level over the shards."""
        return [*seed, self.count, self.index]


class PickedRequests(LazyRequests):
    """Bodies `indices` of `bodies`, in order (built on access, as `bodies` is)."""

    def __init__(self, bodies: LazyRequests, indices: np.ndarray) -> None:
        self.bodies = bodies
        self.indices = [int(i) for i in indices]

    def __len__(self) -> int:
        return len(self.indices)

    def body(self, i: int) -> dict:
        return self.bodies[self.indices[i]]

    def requested(self, i: int) -> tuple[int, int]:
        return self.bodies.requested(self.indices[i])
