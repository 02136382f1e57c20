"""The ready line: every process logs exactly one when it serves.

    ready role=<role> id=<id> listen=<host:port>

The launcher and the tests find a process's address by parsing this line from its log.
"""

from __future__ import annotations

READY_PREFIX = "ready "


def format_ready(role: str, ident: str, listen: str, **extra: str) -> str:
    fields = {"role": role, "id": ident, "listen": listen, **extra}
    return READY_PREFIX + " ".join(f"{k}={v}" for k, v in fields.items())


def parse_ready(line: str) -> dict[str, str] | None:
    """Return the fields of a ready line found anywhere in `line` (after a log prefix), or None."""
    pos = line.find(READY_PREFIX + "role=")
    if pos < 0:
        return None
    fields: dict[str, str] = {}
    for part in line[pos + len(READY_PREFIX) :].split():
        key, sep, value = part.partition("=")
        if sep:
            fields[key] = value
    return fields if "listen" in fields else None
