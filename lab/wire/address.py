"""HOST:PORT addresses, parsed in one place (listen addresses, worker and engine addresses)."""

from __future__ import annotations


def split_address(address: str, allow_port_zero: bool = False) -> tuple[str, int]:
    """Split "host:port" (or "[v6]:port"); ValueError naming the address otherwise.
    Port 0 ("pick a free port") only when `allow_port_zero` (listen addresses)."""
    host, sep, port = address.rpartition(":")
    lowest = 0 if allow_port_zero else 1
    if not sep or not host or not port.isdigit() or not lowest <= int(port) < 65536:
        raise ValueError(f"address {address!r}: expected host:port")
    return host.strip("[]"), int(port)
