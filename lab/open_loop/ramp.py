"""`--ramp-up` of a rate level: the offered rate grows linearly from 0 to the level's rate over
the ramp, then stays there (docs/open-loop.md "Ramp-up").

The ramped schedule is a time change of the level's own schedule: with the rate r(t) = R t / T
during the ramp (T long), the expected arrivals by t are R t^2 / (2 T) during it and
R (t - T / 2) after it, so the stationary arrival at s goes to t = sqrt(2 T s) when s < T / 2,
else to s + T / 2. A Poisson schedule stays Poisson (with the ramp's rate), the seed's arrivals
after the ramp keep their gaps, and the arrivals that land within the ramp are its warm-up.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lab.open_loop.arrivals import NS_PER_S, ArrivalProcess


def ramped_offsets(offsets_ns: np.ndarray, ramp_ns: int) -> np.ndarray:
    """The stationary schedule `offsets_ns` with its rate ramped up from 0 over `ramp_ns`."""
    s = np.asarray(offsets_ns, dtype=np.float64)
    if ramp_ns <= 0:
        return np.asarray(offsets_ns, dtype=np.int64)
    half = ramp_ns / 2
    t = np.where(s < half, np.sqrt(2.0 * ramp_ns * np.maximum(s, 0.0)), s + half)
    return np.round(t).astype(np.int64)


def ramp_schedule(arrival: ArrivalProcess, rate: float, seed: Sequence[int], ramp_s: float, *,
                  measured: int | None = None, duration_s: float | None = None
                  ) -> tuple[np.ndarray, int]:
    """A ramped level's intended offsets and how many of them fall within the ramp (the first
    ones): `measured` arrivals after the ramp, or those within `duration_s` after it."""
    ramp_ns = int(ramp_s * NS_PER_S)
    half_s = ramp_s / 2
    if duration_s is not None:
        n = arrival.count_within(rate, duration_s + half_s, seed)
    else:
        assert measured is not None
        n = (arrival.count_within(rate, half_s, seed) if ramp_ns else 0) + measured
    stationary = arrival.schedule_ns(rate, n, seed)
    in_ramp = int(np.searchsorted(stationary, ramp_ns / 2, side="left")) if ramp_ns else 0
    if measured is not None and duration_s is None:
        stationary = stationary[:in_ramp + measured]
    return ramped_offsets(stationary, ramp_ns), in_ramp
