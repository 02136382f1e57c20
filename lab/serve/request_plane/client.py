"""Request-plane client (owned by the frontend): a pool of persistent connections per worker,
many streams multiplexed on each, CANCEL as a frame. Connection loss ends every stream on that
connection with an END whose error kind is "unavailable" (a stream never hangs on a dead peer)."""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from lab.serve.request_plane.frames import (
    HEADER,
    MAX_PAYLOAD,
    MAX_STREAM_ID,
    FrameType,
    encode_frame,
    error_end,
)
from lab.serve.request_plane.payloads import EndPayload
from lab.serve.request_plane.sockets import FramedConnection, set_nodelay
from lab.shared.settings import SocketSettings
from lab.wire.address import split_address

CONNECT_TIMEOUT_S = 5.0
_REQUEST = int(FrameType.REQUEST)
_CHUNK = int(FrameType.CHUNK)
_END = int(FrameType.END)
_CANCEL_FRAME_TYPE = int(FrameType.CANCEL)


class WorkerUnavailable(ConnectionError):
    """The worker's request-plane address could not be reached."""

    def __init__(self, address: str, reason: str) -> None:
        super().__init__(f"worker {address} unavailable: {reason}")
        self.address = address
        self.reason = reason


def unavailable_end(message: str) -> EndPayload:
    return error_end("unavailable", message, 503)


class ResponseStream:
    """The frames of one request: `async for ftype, payload in stream` (ends after END).

    `direct`: optional. While set and nothing is queued, each CHUNK is offered to it as it
    arrives, in the connection's read callback; it returns True when it took the chunk (then the
    iterator never sees it), False to let the iterator deliver it. This saves a task wake-up per
    token for a consumer that can handle a chunk without waiting; order is kept because a chunk
    is never offered while earlier frames are queued.
    """

    __slots__ = ("_cancel_sent", "_conn", "_done", "_frames", "_waiter", "direct", "stream_id")

    def __init__(self, conn: _ClientConnection, stream_id: int) -> None:
        self._conn = conn
        self.stream_id = stream_id
        self._frames: deque[tuple[int, dict]] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._done = False  # END delivered to the consumer
        self._cancel_sent = False
        self.direct: Callable[[dict], bool] | None = None

    def _deliver(self, ftype: int, payload: Any) -> None:  # a decoded dict or an EndPayload
        if ftype == _CHUNK and not self._frames:
            direct = self.direct
            if direct is not None and direct(payload):
                return
        self._frames.append((ftype, payload))
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def __aiter__(self) -> AsyncIterator[tuple[int, dict]]:
        return self

    async def __anext__(self) -> tuple[int, dict]:
        frames = self._frames
        while not frames:
            if self._done:
                raise StopAsyncIteration
            waiter = self._conn.loop.create_future()
            self._waiter = waiter
            try:
                await waiter
            finally:
                self._waiter = None
        item = frames.popleft()
        if item[0] == _END:
            if self._done:
                raise StopAsyncIteration
            self._done = True
        return item

    @property
    def ended(self) -> bool:
        return self._done

    async def cancel(self) -> None:
        """Send CANCEL (idempotent; a no-op once the stream ended or the connection is gone)."""
        if self._cancel_sent or self._done:
            return
        self._cancel_sent = True
        self._conn.send_cancel(self.stream_id)


class _ClientConnection(FramedConnection):
    def __init__(self, sock: socket.socket, address: str, split_writes: bool) -> None:
        super().__init__(sock)
        self.loop = self._loop
        self.address = address
        self.split_writes = split_writes
        self.streams: dict[int, ResponseStream] = {}
        self._next_id = 1

    def open_stream(self, body: bytes) -> ResponseStream:
        sid = self._next_id
        while sid in self.streams:
            sid = sid % MAX_STREAM_ID + 1
        self._next_id = sid % MAX_STREAM_ID + 1
        stream = ResponseStream(self, sid)
        if len(body) > MAX_PAYLOAD:
            # Never put an oversized frame on a shared connection: the worker would drop the
            # connection, and every other stream on it with it.
            stream._deliver(_END, error_end(
                "invalid_request",
                f"request of {len(body)} bytes exceeds the request plane's frame limit "
                f"({MAX_PAYLOAD} bytes)",
                413,
            ))
            return stream
        self.streams[sid] = stream
        if self.split_writes:
            self.write_split(HEADER.pack(_REQUEST, sid, len(body)), body)
        else:
            self.queue_frame(HEADER.pack(_REQUEST, sid, len(body)) + body)
        return stream

    def send_cancel(self, stream_id: int) -> None:
        if stream_id in self.streams:
            self.queue_frame(encode_frame(_CANCEL_FRAME_TYPE, stream_id))

    def frame_received(self, ftype: int, stream_id: int, payload: bytes) -> None:
        if ftype == _CHUNK:
            stream = self.streams.get(stream_id)
        elif ftype == _END:
            stream = self.streams.pop(stream_id, None)
        else:
            self.close(ValueError(f"unexpected frame type {ftype} from the worker"))
            return
        if stream is not None:
            try:
                message = orjson.loads(payload) if payload else {}
            except orjson.JSONDecodeError as exc:
                reason = f"undecodable frame from worker {self.address}: {exc}"
                self.streams.pop(stream_id, None)
                stream._deliver(_END, unavailable_end(reason))
                self.close(ValueError(reason))  # the other streams end "unavailable" too
                return
            stream._deliver(ftype, message)

    def connection_lost(self, exc: BaseException | None) -> None:
        reason = f"connection to worker {self.address} lost" + (f": {exc}" if exc else "")
        streams, self.streams = self.streams, {}
        for stream in streams.values():
            stream._deliver(_END, unavailable_end(reason))


async def _connect(address: str, timeout: float) -> socket.socket:
    host, port = split_address(address)
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    if not infos:
        raise OSError(f"cannot resolve {host!r}")
    family, type_, proto, _, sockaddr = infos[0]
    sock = socket.socket(family, type_, proto)
    try:
        sock.setblocking(False)
        await asyncio.wait_for(loop.sock_connect(sock, sockaddr), timeout)
    except BaseException:
        sock.close()
        raise
    return sock


class RequestPlaneClient:
    """One per worker address. Connections are opened lazily (up to `settings.pool_size`) and
    used round-robin; a dead connection is replaced on the next `open_stream`."""

    def __init__(self, address: str, settings: SocketSettings | None = None) -> None:
        self.address = address
        self.settings = settings or SocketSettings()
        split_address(address)  # validate early
        size = max(1, self.settings.pool_size)
        self._slots: list[_ClientConnection | None] = [None] * size
        self._locks: list[asyncio.Lock] | None = None
        self._rr = 0
        self._closed = False

    async def _connection(self) -> _ClientConnection:
        if self._closed:
            raise WorkerUnavailable(self.address, "client closed")
        index = self._rr
        self._rr = (index + 1) % len(self._slots)
        conn = self._slots[index]
        if conn is not None and not conn.closed:
            return conn
        if self._locks is None:
            self._locks = [asyncio.Lock() for _ in self._slots]
        async with self._locks[index]:
            conn = self._slots[index]
            if conn is not None and not conn.closed:
                return conn
            try:
                sock = await _connect(self.address, CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError) as exc:
                raise WorkerUnavailable(self.address, str(exc) or type(exc).__name__) from exc
            # Set explicitly both ways: "off" must clear what a loop or the OS might default to.
            set_nodelay(sock, self.settings.client_nodelay)
            conn = _ClientConnection(sock, self.address, self.settings.split_writes)
            if self._closed:
                conn.close()
                raise WorkerUnavailable(self.address, "client closed")
            self._slots[index] = conn
            return conn

    async def open_stream(self, request: dict) -> ResponseStream:
        """Send a REQUEST; raises WorkerUnavailable when the worker cannot be reached."""
        conn = await self._connection()
        return conn.open_stream(orjson.dumps(request))

    async def close(self) -> None:
        self._closed = True
        for i, conn in enumerate(self._slots):
            self._slots[i] = None
            if conn is not None:
                conn.close()
