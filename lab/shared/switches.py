"""The on/off switches of the socket settings on the command line, defined once.

`lab frontend`, `lab sidecar` and the launcher's topology options (`lab up/sweep/nagle`) all
spell a TCP_NODELAY setting as `on` or `off`; the launcher writes those words into the command
lines it builds. One definition keeps the three in step.
"""

from __future__ import annotations

import click

ON_OFF = click.Choice(["on", "off"])


def on_off(value: bool) -> str:
    """True -> "on", False -> "off" (a default shown in --help, or a flag the launcher passes)."""
    return "on" if value else "off"


def is_on(value: str | None) -> bool:
    """The switch's value as a bool ("on" -> True)."""
    return value == "on"
