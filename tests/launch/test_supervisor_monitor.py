"""The supervisor's monitor records every exit, even one it only notices while deciding that
everything has exited (checking `alive` reaps the process)."""

from __future__ import annotations

import json
from pathlib import Path

from launch.events import EventLog
from launch.supervisor import Supervisor
from launch.topology import TopologySpec


class DiesAtTheAliveCheck:
    """A process that is still running at the monitor's reap and has exited by its alive check."""

    name = "engine-0"
    pid = 4242
    popen = object()

    def __init__(self) -> None:
        self.dead = False
        self.exit_seen = False
        self.exit_code: int | None = None
        self.state = "ready"

    def poll(self) -> int | None:
        return 0 if self.dead else None

    @property
    def alive(self) -> bool:
        self.dead = True  # it exits now, and this very check reaps it
        return False


class AlreadyRecorded:
    name = "frontend"
    exit_seen = True
    popen = None
    alive = False


async def test_an_exit_seen_only_by_the_final_alive_check_is_still_an_event(tmp_path: Path) -> None:
    events = EventLog(tmp_path / "events.jsonl")
    sup = Supervisor(TopologySpec.aggregated(), tmp_path, events, f"file:{tmp_path / 'disc'}")
    sup.engines = [DiesAtTheAliveCheck()]  # type: ignore[list-item]
    sup.sidecars = []
    sup.frontend = AlreadyRecorded()  # type: ignore[assignment]
    sup.stopping = True
    await sup._monitor()
    events.close()
    exits = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["event"], e["name"], e["code"]) for e in exits] == [("exit", "engine-0", 0)]
