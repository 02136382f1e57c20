"""The events of one stream that are ready in the same event-loop turn leave in one write.

The request plane hands the frontend every CHUNK of a socket read in one callback (several per
stream when the engine ran ahead: docs/token-path.md). Writing each SSE event to the client's
transport at once costs one send() per event: uvloop does not merge small writes. A
`TurnWriter` keeps the bytes of the turn and writes them with one `transport.write` from a
`loop.call_soon` callback, i.e. after the read callback has offered every frame. Only writes
are merged: every event keeps its own `data:` line and HTTP chunk.
"""

from __future__ import annotations

import asyncio


class TurnWriter:
    __slots__ = ("_loop", "_parts", "_size", "transport")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._parts: list[bytes] = []
        self._size = 0
        self.transport: asyncio.Transport | None = None

    @property
    def pending(self) -> int:
        """Bytes held for this turn's write."""
        return self._size

    def write(self, data: bytes) -> None:
        """Hold `data` for the write at the end of this turn (scheduled by the first one)."""
        if not self._parts:
            self._loop.call_soon(self.flush)
        self._parts.append(data)
        self._size += len(data)

    def flush(self) -> None:
        """Write what is held now (idempotent). Called at the end of the turn, and before any
        other write to the same response so that nothing overtakes it."""
        parts = self._parts
        if not parts:
            return
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        parts.clear()
        self._size = 0
        t = self.transport
        if t is not None and not t.is_closing():
            t.write(data)
