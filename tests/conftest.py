from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.procs import Proc, start

# Property tests check what an example does, not how fast: on a loaded 2-core machine one
# example of a wire round trip took 327 ms, past hypothesis's default 200 ms deadline.
settings.register_profile("loaded-machine", deadline=None)
settings.load_profile("loaded-machine")


def pytest_report_header(config: pytest.Config) -> str:
    """Say up front what the kernel-dependent tests rely on, and what this kernel has."""
    try:
        thresh = Path("/proc/sys/net/ipv4/tcp_pingpong_thresh").read_text().strip()
    except OSError:
        thresh = "unknown"
    return (
        "tests marked kernel_delayed_ack assert Linux's >= 40 ms delayed-ACK timer on loopback "
        f"(here: net.ipv4.tcp_pingpong_thresh={thresh}); deselect with -m 'not kernel_delayed_ack'"
    )


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
