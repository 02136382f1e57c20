"""`lab sweep`'s open-loop options, defined once (the click options come from here):
`--rate`, `--arrival` and `--max-concurrency` (docs/open-loop.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from lab.load.client_settings import MAX_CONCURRENCY
from lab.open_loop.arrivals import ArrivalProcess
from lab.shared.config_cli import Settings, setting
from lab.shared.rates import MAX_RATE, parse_rates

__all__ = ["MAX_RATE", "ArrivalSettings", "parse_arrival", "parse_rate_option", "parse_rates"]


def parse_rate_option(value: str) -> tuple[float, ...] | Literal["auto"]:
    """--rate: a list of rates, or `auto` (search the saturation rate)."""
    return "auto" if value.strip() == "auto" else parse_rates(value)


def _format_rate(value: tuple[float, ...] | str) -> list[str]:
    return [value if isinstance(value, str) else ",".join(f"{r:g}" for r in value)]


def parse_arrival(value: str) -> str:
    return str(ArrivalProcess.parse(value))


class ArrivalSettings(Settings):
    """Open-loop load: request rates and their arrival process (instead of --conc)."""

    rate: tuple[float, ...] | Literal["auto"] | None = setting(
        None, "Open-loop levels, in requests/s, comma-separated, instead of --conc: each "
        "request is sent at its intended time whatever the server does. `auto`: find the "
        "highest rate the stack sustains (with an --slo-*: at which --slo-share of the requests "
        "meet every SLO), from the closed-loop throughput at c=32, in at most --max-levels rate "
        "levels (bracket, then bisect).", parse=parse_rate_option,
        metavar="LIST|auto", format=_format_rate, default_text="none (closed loop, --conc)")
    arrival: str = setting(
        "poisson", "Arrival process of --rate: poisson, gamma:CV (CV > 1 burstier, < 1 "
        "smoother) or constant; seeded by --seed.", parse=parse_arrival,
        metavar="poisson|gamma:CV|constant")
    max_concurrency: int | None = setting(
        None, "With --rate: at most this many requests in flight; a request due while the cap "
        "is reached waits at the client (its wait is recorded, never dropped).", ge=1,
        le=MAX_CONCURRENCY,
        default_text="no cap")

    @model_validator(mode="after")
    def _cap_needs_rate(self) -> ArrivalSettings:
        if self.max_concurrency is not None and not self.rate:
            raise ValueError("--max-concurrency caps an open-loop level: it needs --rate")
        return self

    @property
    def rates(self) -> list[float] | None:
        return list(self.rate) if self.rate and self.rate != "auto" else None

    @property
    def auto(self) -> bool:
        return self.rate == "auto"

    @property
    def process(self) -> ArrivalProcess:
        return ArrivalProcess.parse(self.arrival)
