"""Request rates as the command line gives them (requests/s, comma-separated): one parser for
`lab sweep --rate` and `lab render k8s --client-rate`, below both `lab` and `launch`."""

from __future__ import annotations

import math

#: The highest rate one level may ask for (requests/s).
MAX_RATE = 100_000.0


def parse_rates(value: str) -> tuple[float, ...]:
    """'10,50,100' -> (10.0, 50.0, 100.0), sorted and unique; ValueError naming the bad item."""
    items = [v.strip() for v in str(value).split(",")]
    if not all(items):
        raise ValueError(f"{value!r} has an empty item (expected requests/s, e.g. 10,50,100)")
    out = set()
    for item in items:
        try:
            rate = float(item)
        except ValueError:
            raise ValueError(f"{item!r} is not a number (expected requests/s, e.g. "
                             "10,50,100)") from None
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"{item!r} is not a positive finite rate")
        if rate > MAX_RATE:
            raise ValueError(f"{item} exceeds the limit of {MAX_RATE:g} requests/s")
        out.add(rate)
    return tuple(sorted(out))
