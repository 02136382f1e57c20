"""A process's own TCP connections, found from outside the code that owns them.

The request-plane tests look at the sockets the client and the server hold without any hook in
the package: every descriptor of this process that is a socket (/proc/self/fd) is duplicated
and read with getsockname / getpeername / getsockopt. A duplicate shares the socket, so its
options and TCP_INFO counters are the connection's, and `shutdown` on it drops the connection.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass

# struct tcp_info (linux/tcp.h): u32 tcpi_data_segs_out at byte 156, u64 tcpi_bytes_sent at 200
# (Linux 4.19+).
_TCP_INFO_SIZE = 208
_DATA_SEGS_OUT = struct.Struct("=I")
_BYTES_SENT = struct.Struct("=Q")


@dataclass(frozen=True)
class Sent:
    """What a socket has sent: data segments (one per send() of a small payload with
    TCP_NODELAY on loopback) and payload bytes."""

    segments: int
    bytes: int

    def __sub__(self, before: Sent) -> Sent:
        return Sent(self.segments - before.segments, self.bytes - before.bytes)


def sent(sock: socket.socket) -> Sent:
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_SIZE)
    assert len(info) >= _TCP_INFO_SIZE, "TCP_INFO too short (a kernel older than 4.19?)"
    return Sent(_DATA_SEGS_OUT.unpack_from(info, 156)[0], _BYTES_SENT.unpack_from(info, 200)[0])


def nodelay(sock: socket.socket) -> bool:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def _endpoints(sock: socket.socket) -> tuple[str, str] | None:
    try:
        here, there = sock.getsockname(), sock.getpeername()
    except OSError:  # a listener, or not connected
        return None
    return f"{here[0]}:{here[1]}", f"{there[0]}:{there[1]}"


@contextlib.contextmanager
def connections(address: str) -> Iterator[tuple[list[socket.socket], list[socket.socket]]]:
    """This process's open TCP connections to `address` ("host:port"): (the connecting sides,
    the accepted sides), as duplicates closed on exit."""
    found: list[socket.socket] = []
    clients: list[socket.socket] = []
    servers: list[socket.socket] = []
    try:
        for name in os.listdir("/proc/self/fd"):
            try:
                if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                    continue
                sock = socket.socket(fileno=os.dup(int(name)))
            except OSError:  # closed meanwhile (the listing's own descriptor, ...)
                continue
            found.append(sock)
            if sock.type != socket.SOCK_STREAM or sock.family not in (socket.AF_INET,
                                                                       socket.AF_INET6):
                continue
            ends = _endpoints(sock)
            if ends is None:
                continue
            if ends[1] == address:
                clients.append(sock)
            elif ends[0] == address:
                servers.append(sock)
        yield clients, servers
    finally:
        for sock in found:
            sock.close()
