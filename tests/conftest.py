from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.procs import Proc, start


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    """Start real processes; every one is stopped (group SIGTERM, then SIGKILL) at teardown.

    spawn(name, argv, ready=True, timeout=30, env=None) -> Proc
    """
    procs: list[Proc] = []

    def _spawn(
        name: str,
        argv: list[str],
        ready: bool = True,
        timeout: float = 30.0,
        env: dict[str, str] | None = None,
    ) -> Proc:
        proc = start(name, argv, tmp_path / "logs", env=env)
        procs.append(proc)
        if ready:
            proc.wait_ready(timeout)
        return proc

    yield _spawn
    for proc in reversed(procs):
        proc.stop()
