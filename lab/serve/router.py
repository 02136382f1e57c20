"""Worker selection policies of the frontend: round-robin (default), least-loaded, random.

A router picks one of the candidate workers the frontend passes (already filtered by role,
model and exclusions). Least-loaded scores a worker by the load its sidecar last published in
discovery (running + queued requests of the engine, refreshed about once a second) plus the
frontend's own in-flight count for it, which reacts immediately between two samples.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeVar

from lab.shared.settings import DEFAULT_ROUTER, ROUTERS

__all__ = ["DEFAULT_ROUTER", "ROUTERS", "Router", "make_router", "published_load"]


class Candidate(Protocol):
    worker_id: str
    inflight: int

    @property
    def load(self) -> Mapping[str, Any]: ...


C = TypeVar("C", bound=Candidate)

# GetLoad sample keys as the sidecar publishes them (proto names, or MessageToDict camelCase).
_LOAD_KEYS = ("running_requests", "runningRequests", "queued_requests", "queuedRequests")


def published_load(load: Mapping[str, Any]) -> int:
    """Running + queued requests from a published GetLoad sample (0 when absent)."""
    total = 0
    for key in _LOAD_KEYS:
        value = load.get(key)
        if value is not None:
            try:
                total += int(value)
            except (TypeError, ValueError):
                pass
    return total


class Router:
    name = "base"

    def choose(self, candidates: Sequence[C]) -> C:
        raise NotImplementedError


class RoundRobinRouter(Router):
    name = "round-robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, candidates: Sequence[C]) -> C:
        index = self._next % len(candidates)
        self._next = index + 1
        return candidates[index]


class RandomRouter(Router):
    name = "random"

    def __init__(self, seed: int | None = None) -> None:
        self._rng = random.Random(seed)

    def choose(self, candidates: Sequence[C]) -> C:
        return candidates[self._rng.randrange(len(candidates))]


class LeastLoadedRouter(Router):
    """Lowest (published running + queued + local in-flight); ties go round-robin."""

    name = "least-loaded"

    def __init__(self) -> None:
        self._tie = 0

    def choose(self, candidates: Sequence[C]) -> C:
        best: list[C] = []
        best_score = None
        for cand in candidates:
            score = published_load(cand.load) + cand.inflight
            if best_score is None or score < best_score:
                best_score = score
                best = [cand]
            elif score == best_score:
                best.append(cand)
        self._tie += 1
        return best[self._tie % len(best)]


def make_router(name: str, seed: int | None = None) -> Router:
    """A router by its CLI name; ValueError naming the name when unknown."""
    if name == "round-robin":
        return RoundRobinRouter()
    if name == "least-loaded":
        return LeastLoadedRouter()
    if name == "random":
        return RandomRouter(seed)
    raise ValueError(f"unknown router {name!r}: expected one of {', '.join(ROUTERS)}")
