"""What the client knows of a server's keep-alive timeout, to retire idle connections first.

Why: a server closes a kept-alive connection after some idle time (uvicorn's
`timeout_keep_alive`, 5 s in vLLM's OpenAI server). A request written into a connection the
server is closing at that moment is lost ("server closed the connection before the response"):
an error the server did not cause. Knowing the timeout, the client opens a new connection
instead of reusing one idle that long (`Http1Connection.stale`). It is learned from a
`Keep-Alive: timeout=N` response header (uvicorn sends none) or from an idle close the client
sees; the lost request that remains possible is resent by `lab.load.http1`.

One `KeepAlive` per origin (scheme, host, port), shared by its connections in this process.
"""

from __future__ import annotations

#: An idle close shorter than this teaches nothing (a server restarting, a proxy resetting):
#: retiring connections after milliseconds would turn every request into a connect.
MIN_LEARNED_S = 1.0
#: Retire this long before the timeout (at most; a quarter of it for short timeouts).
MARGIN_S = 1.0


class KeepAlive:
    """The idle time after which a connection to one origin is retired (None: unknown)."""

    __slots__ = ("retire_after_ns",)

    def __init__(self) -> None:
        self.retire_after_ns: int | None = None

    def heard(self, header: bytes) -> None:
        """A `Keep-Alive` response header's value (`timeout=5, max=100`)."""
        for part in header.split(b","):
            name, _, value = part.partition(b"=")
            if name.strip().lower() == b"timeout":
                try:
                    timeout_s = float(value)
                except ValueError:
                    return
                if timeout_s > 0:
                    self._limit(timeout_s)
                return

    def saw_idle_close(self, idle_ns: int) -> None:
        """The server closed a connection of ours that had been idle `idle_ns`."""
        if idle_ns >= MIN_LEARNED_S * 1e9:
            self._limit(idle_ns / 1e9)

    def _limit(self, timeout_s: float) -> None:
        ns = int((timeout_s - min(MARGIN_S, timeout_s / 4)) * 1e9)
        if self.retire_after_ns is None or ns < self.retire_after_ns:
            self.retire_after_ns = ns


_BY_ORIGIN: dict[tuple[str, str, int], KeepAlive] = {}


def keep_alive_for(scheme: str, host: str, port: int) -> KeepAlive:
    """The shared `KeepAlive` of an origin."""
    key = (scheme, host, port)
    ka = _BY_ORIGIN.get(key)
    if ka is None:
        ka = _BY_ORIGIN[key] = KeepAlive()
    return ka
