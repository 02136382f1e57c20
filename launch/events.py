"""events.jsonl: one JSON line per start, ready, exit (with code), restart, fault, stop."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


class EventLog:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", buffering=1)  # noqa: SIM115 - lives as long as the run
        self.listeners: list[Any] = []  # callables(event dict), e.g. `lab up` printing events

    def emit(self, event: str, name: str = "", pid: int | None = None,
             code: int | None = None, **extra: Any) -> dict[str, Any]:
        record = {
            "t_ns": time.perf_counter_ns(),
            "wall": time.time(),
            "event": event,
            "name": name,
            "pid": pid,
            "code": code,
            **extra,
        }
        self.record(record)
        return record

    def record(self, record: dict[str, Any]) -> None:
        """Write an event as it is: one emitted here, or one a Ray node's agent emitted
        (launch.ray_fleet forwards those, its stamps moved onto this clock)."""
        if not self._file.closed:
            self._file.write(json.dumps(record) + "\n")
        for listener in self.listeners:
            listener(record)

    def close(self) -> None:
        self._file.close()


def read_events(path: Path) -> list[dict[str, Any]]:
    """All events of a run (tolerates a torn last line)."""
    events: list[dict[str, Any]] = []
    if not path.exists():
        return events
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events
