"""`--ramp-up` of a rate level: the schedule's time change (lab.open_loop.ramp)."""

from __future__ import annotations

import numpy as np

from lab.open_loop.arrivals import ArrivalProcess
from lab.open_loop.ramp import ramp_schedule, ramped_offsets

S = 1_000_000_000


def test_the_ramped_rate_grows_linearly_then_keeps_the_schedules_gaps() -> None:
    constant = np.arange(1, 81) * (S // 40)  # 40/s for 2 s
    t = ramped_offsets(constant, S)
    # within the 1 s ramp, arrival i is at sqrt(2 T s_i): the count by t is R t^2 / (2 T)
    in_ramp = t[t < S]
    assert len(in_ramp) == 19
    assert np.allclose(in_ramp, np.sqrt(2.0 * S * constant[:19]), atol=1)
    assert (t[t < S // 2] < S // 2).sum() == 4  # a quarter of the ramp's arrivals in its first half
    after = t[19:]
    assert np.array_equal(np.diff(after), np.diff(constant[19:]))  # the gaps after the ramp
    assert np.all(np.diff(t) > 0)


def test_a_ramped_level_keeps_its_measured_count_after_the_ramp() -> None:
    arrival = ArrivalProcess.parse("poisson")
    offsets, in_ramp = ramp_schedule(arrival, 100.0, [1, 2, 3], 2.0, measured=300)
    assert len(offsets) - in_ramp == 300
    assert np.all(offsets[:in_ramp] < 2 * S) and np.all(offsets[in_ramp:] >= 2 * S)
    assert 60 <= in_ramp <= 140  # 100/s ramped over 2 s: about 100 arrivals
    timed, timed_ramp = ramp_schedule(arrival, 100.0, [1, 2, 3], 2.0, duration_s=3.0)
    assert np.all(timed[timed_ramp:] < 5 * S) and 200 <= len(timed) - timed_ramp <= 400
