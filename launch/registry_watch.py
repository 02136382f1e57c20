"""Discovery as events: `registered` / `withdrawn` lines in events.jsonl when a worker's record
appears, changes owner (a restarted sidecar re-registers) or disappears.

This is how a fault report tells when a worker left discovery and when it was back, on the
same clock as the launcher's start/exit/restart events. File registries only (polled every
0.1 s; a record is a `<worker_id>.json` file written with tmp + rename).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from launch.events import EventLog

POLL_S = 0.1


def _snapshot(directory: Path) -> dict[str, tuple[Any, Any]]:
    """worker_id -> (pid, address) of every record now present."""
    records: dict[str, tuple[Any, Any]] = {}
    try:
        paths = list(directory.glob("*.json"))
    except OSError:
        return records
    for path in paths:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        records[path.stem] = (data.get("pid"), data.get("address"))
    return records


class RegistryWatch:
    def __init__(self, directory: Path, events: EventLog) -> None:
        self.directory = directory
        self.events = events
        self.known: dict[str, tuple[Any, Any]] = {}

    def scan(self) -> None:
        """Compare the records now present with the last scan; emit the differences."""
        now = _snapshot(self.directory)
        for worker, (pid, address) in now.items():
            if self.known.get(worker) != (pid, address):
                self.events.emit("registered", worker, pid, address=address)
        for worker, (pid, _address) in self.known.items():
            if worker not in now:
                self.events.emit("withdrawn", worker, pid)
        self.known = now

    def on_event(self, event: dict[str, Any]) -> None:
        """A sidecar the supervisor found registered: record it now, before anyone can act on
        its readiness (a fault right after start-up must not beat the next poll)."""
        if event["event"] == "ready" and event["name"].startswith("sidecar-"):
            self.scan()

    def on_exit(self, proc: Any) -> None:
        """A sidecar exited: a withdrawal that came before it is recorded before the exit."""
        if proc.role == "sidecar":
            self.scan()

    async def run(self) -> None:
        """Scan until cancelled."""
        while True:
            self.scan()
            await asyncio.sleep(POLL_S)
