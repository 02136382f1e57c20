"""HTTP/2 keepalive PINGs on the client's connection, after grpcio's keepalive channel args.

* `grpc.keepalive_time_ms`: how long the connection may stay quiet before a PING is sent;
* `grpc.keepalive_timeout_ms` (20 s by default, as grpcio): how long the PING's ACK may take.
  Past it the connection is declared dead and aborted: every call on it fails UNAVAILABLE with
  `KEEPALIVE_LOST` in its details ("keepalive watchdog timeout", grpc-core's words);
* `grpc.keepalive_permit_without_calls` (0 by default): PING also while no call is open.

Without `grpc.keepalive_time_ms` no PING is ever sent (grpcio's client default).

Quiet means nothing was received since the last tick (`H2Connection.received`, set by every
recv()). A connection that carries frames is evidently alive and sends no PING, so the token
path pays one attribute store per recv() and nothing else: a PING goes out only after between
one and two intervals of silence, e.g. on a connection to a SIGSTOPped peer, whose kernel keeps
the TCP connection open while nothing answers. The timers are `loop.call_later` handles the
connection cancels when it closes: no task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from . import frames as f
from .conn import H2Connection

#: In the details of every call that a keepalive timeout ended (the sidecar tells a frozen
#: engine from a lost one by it).
KEEPALIVE_LOST = "keepalive watchdog timeout"
#: grpcio's default keepalive timeout.
DEFAULT_TIMEOUT_MS = 20_000
#: grpcio's "disabled" keepalive time (INT_MAX ms).
_DISABLED_MS = 2**31 - 1


@dataclass(frozen=True)
class KeepaliveSettings:
    interval_s: float
    timeout_s: float
    without_calls: bool = False

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> KeepaliveSettings | None:
        """From grpcio channel options; None when keepalive is off (no or disabled time)."""
        time_ms = int(options.get("grpc.keepalive_time_ms", _DISABLED_MS))
        if not 0 < time_ms < _DISABLED_MS:
            return None
        timeout_ms = int(options.get("grpc.keepalive_timeout_ms", DEFAULT_TIMEOUT_MS))
        if timeout_ms <= 0:
            raise ValueError(f"grpc.keepalive_timeout_ms {timeout_ms}: must be > 0")
        without = bool(int(options.get("grpc.keepalive_permit_without_calls", 0)))
        return cls(time_ms / 1000, timeout_ms / 1000, without)


class Keepalive:
    """One connection's PING timer and ACK deadline (see the module docstring)."""

    def __init__(
        self, conn: H2Connection, settings: KeepaliveSettings, on_dead: Callable[[str], None]
    ) -> None:
        self.conn = conn
        self.settings = settings
        self._on_dead = on_dead
        self._tick: asyncio.TimerHandle | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._payload = b""
        self.pings = 0  # PINGs sent

    def start(self) -> None:
        self._tick = self.conn.loop.call_later(self.settings.interval_s, self._on_tick)

    def stop(self) -> None:
        for handle in (self._tick, self._deadline):
            if handle is not None:
                handle.cancel()
        self._tick = self._deadline = None

    def _on_tick(self) -> None:
        conn = self.conn
        self._tick = None
        if conn.closed:
            return
        if conn.received or not (conn.streams or self.settings.without_calls):
            conn.received = False
            self.start()
            return
        self.pings += 1
        self._payload = self.pings.to_bytes(8, "big")
        conn.write(f.frame(f.PING, 0, 0, self._payload))
        self._deadline = conn.loop.call_later(self.settings.timeout_s, self._expired)

    def acked(self, payload: bytes) -> None:
        """A PING ACK arrived: ours ends its deadline and restarts the quiet timer."""
        if self._deadline is None or payload != self._payload:
            return
        self._deadline.cancel()
        self._deadline = None
        self.conn.received = False
        self.start()

    def _expired(self) -> None:
        self._deadline = None
        if not self.conn.closed:
            self._on_dead(
                f"{KEEPALIVE_LOST}: no PING ACK within {self.settings.timeout_s:g} s"
            )
