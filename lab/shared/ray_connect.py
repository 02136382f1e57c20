"""Connecting to a Ray cluster and measuring an actor's clock: what the Ray load client
(`lab.load.ray_client`) and the stack's node agents (`launch.ray_fleet`) share (docs/ray.md).

Ray is imported only inside the functions (`pip install 'loadlab[ray]'`).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

#: How long the head's GCS port gets to accept a TCP connection before ray.init is tried.
CONNECT_CHECK_S = 5.0


class RayConnectError(RuntimeError):
    """No Ray (the extra is not installed) or no cluster at the address; the message says so."""


def parse_address(value: str) -> str:
    """`auto` or HOST:PORT (the head's GCS address); ValueError naming the bad input."""
    value = value.strip()
    if value == "auto":
        return value
    host, sep, port = value.rpartition(":")
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"{value!r}: expected auto or HOST:PORT (the Ray head's address)")
    return value


def ray_address_setting(what: str, default_text: str) -> str | None:
    """The `--ray ADDRESS|auto` field of a command's settings (`lab up`, `lab sweep`): `what`
    says what runs on the cluster."""
    from lab.shared.config_cli import setting

    return setting(
        None, f"Run {what} on this Ray cluster (`auto`: the cluster `ray start` runs here; or "
        "its GCS address HOST:PORT); docs/ray.md. Needs `pip install 'loadlab[ray]'`.",
        metavar="ADDRESS|auto", parse=parse_address, default_text=default_text)


def ray_environment() -> None:
    """The process environment the lab runs Ray in: no usage-stats reporting."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def connect(address: str) -> bool:
    """Connect this process to the cluster at `address` (`auto` or HOST:PORT), unless it is
    connected already; True when this call connected it (so the caller disconnects it)."""
    ray_environment()
    try:
        import ray
    except ImportError:
        raise RayConnectError("--ray needs Ray: pip install 'loadlab[ray]'") from None
    if ray.is_initialized():
        return False
    if address != "auto":  # a wrong address would leave ray.init retrying for minutes
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=CONNECT_CHECK_S).close()
        except OSError as exc:
            raise RayConnectError(f"--ray {address}: cannot connect: {exc}") from None
    # ray.init replaces the SIGTERM handler with one that exits at once (SystemExit): a
    # handler the caller had installed (e.g. `lab up`'s, which tears the stack down in order)
    # is put back
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.WARNING, configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise RayConnectError(f"--ray {address}: cannot connect: {exc}") from None
    finally:
        if main and callable(previous):
            signal.signal(signal.SIGTERM, previous)
    return True


@dataclass
class ClockOffset:
    """An actor's clock against the driver's: remote = driver + offset_ns, within error_ns."""

    offset_ns: int
    error_ns: int
    pings: int


async def measure_offset(ping: Callable[[], Awaitable[int]], pings: int) -> ClockOffset:
    """NTP-style: `ping()` returns the remote's perf_counter_ns(); the offset of the ping with
    the smallest round trip, within rtt/2."""
    best: tuple[int, int] | None = None
    for _ in range(pings):
        t0 = time.perf_counter_ns()
        remote = await ping()
        t1 = time.perf_counter_ns()
        rtt = t1 - t0
        if best is None or rtt < best[0]:
            best = (rtt, remote - (t0 + t1) // 2)
    assert best is not None
    return ClockOffset(offset_ns=best[1], error_ns=(best[0] + 1) // 2, pings=pings)
