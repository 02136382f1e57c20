"""A port held for a child process: bound here, listened on by the child, never free between.

Choosing a free port, closing it and handing its number to a child races: between the close and
the child's bind, anything else on the machine may take the port. A `PortHold` keeps the port
bound (SO_REUSEADDR, not listening) while the child starts: no other bind and no ephemeral pick
gets it, yet a child that binds with SO_REUSEADDR (asyncio servers, the lab's gRPC and
request-plane servers, Go's listeners: etcd) may listen on it, because Linux lets a reusable
socket bind beside one that is not listening. Close the hold once the child listens (or keep it
for the child's life, so that a restarted child finds its port still free).
"""

from __future__ import annotations

import socket
from types import TracebackType


class PortHold:
    """`host`:`port` (0: a port the OS picks) bound and held until `close`."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind((host, port))
        except OSError:
            self._sock.close()
            raise
        self.host = host
        self.port: int = self._sock.getsockname()[1]

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> PortHold:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
