"""The arms of `lab nagle`: what each arm changes, and which run (the probe's options are
`lab.nagle.settings.NagleSettings`).

On the launched stack an arm is one `SocketSettings` (docs/nagle.md, "The knobs"); against
--target it is a traffic shape (reused or fresh connections, idle gaps, streaming or not).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import click

from lab.shared.settings import SocketSettings

DEFAULT_REQUESTS = 200
DEFAULT_MANY = 32
DEFAULT_ARMS = ("control", "suspect")
DEFAULT_EXTERNAL_GAP_MS = 100.0
SINGLE = 1


@dataclass(frozen=True)
class Arm:
    """One arm: what differs (socket settings on the launched stack, traffic shape otherwise)."""

    name: str
    label: str
    sockets: SocketSettings | None = None  # launched stack only
    fresh_connection: bool = False
    gap_ms: float = 0.0
    stream: bool = True
    levels: tuple[int, ...] = (SINGLE, DEFAULT_MANY)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["sockets"] = None if self.sockets is None else asdict(self.sockets)
        return d


_SUSPECT = SocketSettings(client_nodelay=False, split_writes=True)

# The launched stack's arms: each differs from the defaults in the settings its label names.
LAUNCHED_ARMS: dict[str, Arm] = {
    a.name: a
    for a in (
        Arm("control", "NODELAY on both ends and coalesced writes", SocketSettings()),
        Arm("suspect", "client NODELAY off and split writes", _SUSPECT),
        Arm("server-nodelay-off", "server NODELAY off", SocketSettings(server_nodelay=False)),
        Arm(
            "both-off",
            "NODELAY off on both ends and split writes",
            SocketSettings(client_nodelay=False, server_nodelay=False, split_writes=True),
        ),
        Arm(
            "coalesced-nodelay-off",
            "NODELAY off on both ends with coalesced writes",
            SocketSettings(client_nodelay=False, server_nodelay=False, split_writes=False),
        ),
        Arm(
            "http-nodelay-off",
            "NODELAY off on the frontend's HTTP connections",
            SocketSettings(http_nodelay=False),
        ),
        Arm(
            "fresh-connection",
            "client NODELAY off and split writes, one HTTP connection per request",
            _SUSPECT,
            fresh_connection=True,
        ),
    )
}
EXTERNAL_ARMS = ("reused", "fresh-connection", "gap", "non-streaming")


def csv_list(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def parse_gaps(text: str) -> list[float]:
    try:
        gaps = [float(p) for p in csv_list(text)]
    except ValueError:
        raise click.BadParameter(
            f"{text!r}: expected comma-separated numbers", param_hint="--gap-ms"
        ) from None
    if not gaps or any(g < 0 for g in gaps):
        raise click.BadParameter(f"{text!r}: expected numbers >= 0", param_hint="--gap-ms")
    return gaps


def _fmt_gap(g: float) -> str:
    return f"{g:g}ms"


def launched_arms(names: list[str], gaps: list[float], many: int) -> list[Arm]:
    """The launched-stack arms selected by --arms, plus one suspect arm per non-zero --gap-ms
    (those run at concurrency 1 only: an idle gap means nothing under continuous traffic)."""
    if names == ["all"]:
        names = list(LAUNCHED_ARMS)
    unknown = [n for n in names if n not in LAUNCHED_ARMS]
    if unknown:
        raise click.BadParameter(
            f"unknown arm {unknown[0]!r} (known: {', '.join(LAUNCHED_ARMS)}, or all)",
            param_hint="--arms",
        )
    arms = [replace(LAUNCHED_ARMS[n], levels=(SINGLE, many)) for n in dict.fromkeys(names)]
    for g in gaps:
        if g > 0:
            arms.append(
                Arm(
                    f"suspect-gap-{_fmt_gap(g)}",
                    f"client NODELAY off and split writes, {g:g} ms idle between requests",
                    _SUSPECT,
                    gap_ms=g,
                    levels=(SINGLE,),
                )
            )
    return arms


def external_arms(names: list[str], gaps: list[float], many: int) -> list[Arm]:
    """Traffic shapes against a stack the lab did not launch."""
    if names == ["all"]:
        names = list(EXTERNAL_ARMS)
    unknown = [n for n in names if n not in EXTERNAL_ARMS]
    if unknown:
        raise click.BadParameter(
            f"unknown arm {unknown[0]!r} with --target (known: {', '.join(EXTERNAL_ARMS)}, "
            "or all; socket-setting arms need the launched stack)",
            param_hint="--arms",
        )
    arms: list[Arm] = [
        Arm("reused", "one reused connection, back to back", levels=(SINGLE, many))
    ]
    if "fresh-connection" in names:
        arms.append(
            Arm("fresh-connection", "a fresh connection per request", fresh_connection=True,
                levels=(SINGLE, many))
        )
    if "gap" in names:
        for g in gaps:
            if g > 0:
                arms.append(
                    Arm(f"gap-{_fmt_gap(g)}", f"{g:g} ms idle between requests on one connection",
                        gap_ms=g, levels=(SINGLE,))
                )
    if "non-streaming" in names:
        arms.append(
            Arm("non-streaming", "non-streaming on one reused connection (TTFT = full response)",
                stream=False, levels=(SINGLE,))
        )
    return arms
