"""What the frontend needs from a request-plane client and its streams, as Protocols.

`RequestPlaneClient` / `ResponseStream` (this package) are the real implementation; the test
fakes (tests/serve/fakes.py) are another. The frontend (`lab.serve.frontend.workers`,
`lab.serve.frontend.dispatch`) is written against these Protocols only, so it never bends for a
test double and the type checker holds both sides to the same interface.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from lab.shared.settings import SocketSettings


class PlaneStream(Protocol):
    """The frames of one request: `async for ftype, payload in stream`, ending after END."""

    #: Optional fast path: offered each CHUNK as it arrives while nothing is queued; returns
    #: True when it took the chunk (the iterator then never sees it).
    direct: Callable[[dict[str, Any]], bool] | None

    def __aiter__(self) -> AsyncIterator[tuple[int, dict[str, Any]]]: ...

    async def cancel(self) -> None:
        """Send CANCEL (the client went away); the stream still ends with an END."""
        ...


class PlaneClient(Protocol):
    """The frontend's client for one worker address."""

    address: str

    async def open_stream(self, request: dict[str, Any]) -> PlaneStream:
        """Send REQUEST on a pooled connection; raises when the worker cannot be reached."""
        ...

    async def close(self) -> None: ...


#: How the frontend gets a client for a worker's address (tests pass their fakes' factory).
ClientFactory = Callable[[str, SocketSettings], PlaneClient]
