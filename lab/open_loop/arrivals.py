"""Arrival schedules of an open-loop level: when each request is meant to be sent.

A schedule is a seeded function of (process, rate, count): the same seed gives the same
intended send times, to the nanosecond. Offsets are from the level's start; the first request is
due one inter-arrival gap after it (as in a Poisson process started at 0).

- `poisson`: exponential gaps of mean 1/rate (coefficient of variation 1);
- `gamma:CV`: gamma gaps of mean 1/rate and coefficient of variation CV (shape 1/CV^2; CV 1
  is Poisson, CV < 1 smoother, CV > 1 burstier);
- `constant`: every gap exactly 1/rate.

`--client-procs K` splits one schedule over K processes by giving each arrival to a process
drawn uniformly at random (seeded). Random splitting of a Poisson process gives K independent
Poisson processes of rate/K, and the merged schedule is the one drawn for the seed whatever K is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

NS_PER_S = 1_000_000_000
ARRIVAL_KINDS = ("poisson", "gamma", "constant")
#: Seed stream offsets, so the gaps and the split over processes never share random numbers.
_SPLIT_STREAM = 1


@dataclass(frozen=True)
class ArrivalProcess:
    """How a level's requests arrive: `kind` one of ARRIVAL_KINDS, `cv` for gamma."""

    kind: str = "poisson"
    cv: float = 1.0

    @classmethod
    def parse(cls, text: str) -> ArrivalProcess:
        """'poisson', 'constant' or 'gamma:CV' (CV > 0); ValueError naming what is wrong."""
        name, sep, arg = text.strip().partition(":")
        if name == "gamma":
            try:
                cv = float(arg)
            except ValueError:
                raise ValueError(f"{text!r}: expected gamma:CV with CV a number > 0, e.g. "
                                 "gamma:2") from None
            if not (math.isfinite(cv) and cv > 0):
                raise ValueError(f"{text!r}: the CV of gamma:CV must be a finite number > 0")
            return cls("gamma", cv)
        if name in ("poisson", "constant") and not sep:
            return cls(name, 1.0 if name == "poisson" else 0.0)
        raise ValueError(f"{text!r}: expected poisson, constant or gamma:CV (e.g. gamma:2)")

    def __str__(self) -> str:
        return f"gamma:{self.cv:g}" if self.kind == "gamma" else self.kind

    def gaps_s(self, rate: float, n: int, seed: Sequence[int]) -> np.ndarray:
        """`n` inter-arrival gaps in seconds, mean 1/rate."""
        mean = 1.0 / rate
        if self.kind == "constant":
            return np.full(n, mean)
        rng = np.random.default_rng([*seed, 0])
        if self.kind == "poisson":
            return rng.exponential(mean, n)
        shape = 1.0 / (self.cv * self.cv)
        return rng.gamma(shape, mean / shape, n)

    def schedule_ns(self, rate: float, n: int, seed: Sequence[int]) -> np.ndarray:
        """Intended send offsets (ns from the level's start) of `n` requests, ascending."""
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"rate must be a finite number > 0 (got {rate})")
        return np.round(np.cumsum(self.gaps_s(rate, n, seed)) * NS_PER_S).astype(np.int64)

    def count_within(self, rate: float, duration_s: float, seed: Sequence[int]) -> int:
        """How many arrivals of the schedule fall within `duration_s` (a timed level)."""
        n = max(16, int(rate * duration_s * 1.2) + 64)
        while True:
            offsets = self.schedule_ns(rate, n, seed)
            if offsets[-1] > duration_s * NS_PER_S:
                return int(np.searchsorted(offsets, duration_s * NS_PER_S, side="right"))
            n *= 2


def schedule_seed(seed: int, rate: float, repeat: int) -> list[int]:
    """The seed of one level's schedule: the sweep's --seed, the rate (to the mHz) and the
    repeat, so every level has its own arrivals and a rerun the same ones."""
    return [seed, round(rate * 1000), repeat]


def split_streams(n: int, procs: int, seed: Sequence[int]) -> np.ndarray:
    """The client process (0..procs-1) of each of `n` arrivals: uniform, seeded."""
    if procs <= 1:
        return np.zeros(n, dtype=np.int64)
    return np.random.default_rng([*seed, _SPLIT_STREAM]).integers(0, procs, n)
