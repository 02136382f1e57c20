"""Request-plane server (owned by the sidecar): accepts connections, calls the handler once per
REQUEST stream with a StreamSink, turns CANCEL (or a dropped connection) into `sink.cancelled`.

Every chunk() is one CHUNK frame: frames are never merged (each carries one engine step's
tokens), but all frames of a connection from one loop iteration leave in one send().
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable

import orjson

from lab.serve.request_plane.frames import HEADER, FrameType, error_end
from lab.serve.request_plane.payloads import EndPayload
from lab.serve.request_plane.sockets import FramedConnection, set_nodelay
from lab.shared.settings import SocketSettings

log = logging.getLogger(__name__)

_REQUEST = int(FrameType.REQUEST)
_CANCEL = int(FrameType.CANCEL)
_CHUNK = int(FrameType.CHUNK)
_END = int(FrameType.END)
dumps = orjson.dumps
pack = HEADER.pack


class StreamSink:
    """Where a handler writes one stream's frames: a CHUNK per chunk(), then one END."""

    __slots__ = ("_conn", "_ended", "cancelled", "on_cancel", "stream_id")

    def __init__(self, conn: _ServerConnection, stream_id: int) -> None:
        self._conn = conn
        self.stream_id = stream_id
        self.cancelled = asyncio.Event()
        # Optional: called (once, synchronously) when the stream is cancelled. Lets a handler
        # react without a task parked on `cancelled.wait()`.
        self.on_cancel: Callable[[], None] | None = None
        self._ended = False

    def _cancel(self) -> None:
        if self.cancelled.is_set():
            return
        self.cancelled.set()
        callback = self.on_cancel
        if callback is not None:
            self.on_cancel = None
            try:
                callback()
            except Exception:
                log.exception("on_cancel callback failed")

    @property
    def ended(self) -> bool:
        return self._ended

    def chunk(self, payload: dict) -> None:
        """Queue a CHUNK {"t": [...], "lp"?: [...], "top"?: [...]} as its own frame."""
        conn = self._conn
        if self._ended or conn.closed:
            return
        body = dumps(payload)
        conn.queue_frame(pack(_CHUNK, self.stream_id, len(body)) + body)

    def end(self, payload: EndPayload) -> None:
        """Queue the END (once; later calls are ignored). Goes out after the queued CHUNKs."""
        if self._ended:
            return
        self._ended = True
        conn = self._conn
        conn.streams.pop(self.stream_id, None)
        if conn.closed:
            return
        body = orjson.dumps(payload)
        conn.queue_frame(HEADER.pack(_END, self.stream_id, len(body)) + body)


Handler = Callable[[dict, StreamSink], Awaitable[None]]


class _ServerConnection(FramedConnection):
    def __init__(self, sock: socket.socket, server: RequestPlaneServer) -> None:
        super().__init__(sock)
        self.server = server
        self.streams: dict[int, StreamSink] = {}

    def frame_received(self, ftype: int, stream_id: int, payload: bytes) -> None:
        if ftype == _REQUEST:
            if stream_id in self.streams:
                self.close(ValueError(f"duplicate stream id {stream_id}"))
                return
            sink = StreamSink(self, stream_id)
            self.streams[stream_id] = sink
            try:
                request = orjson.loads(payload)
                if not isinstance(request, dict):
                    raise TypeError("a request must be a JSON object")
            except (ValueError, TypeError) as exc:
                sink.end(error_end("protocol", f"bad request frame: {exc}", 400))
                return
            self.server._spawn(request, sink)
        elif ftype == _CANCEL:
            cancelled = self.streams.get(stream_id)
            if cancelled is not None:
                cancelled._cancel()
        else:
            self.close(ValueError(f"unexpected frame type {ftype} from the client"))

    def connection_lost(self, exc: BaseException | None) -> None:
        self.server._forget(self)
        streams, self.streams = self.streams, {}
        for sink in streams.values():
            sink._cancel()


class RequestPlaneServer:
    """`await start(host, port)` -> "host:port"; `await close()` stops accepting, cancels the
    handlers still running and closes the connections."""

    def __init__(self, handler: Handler, settings: SocketSettings | None = None) -> None:
        self.handler = handler
        self.settings = settings or SocketSettings()
        self._listener: socket.socket | None = None
        self._connections: set[_ServerConnection] = set()
        self._unconnected = asyncio.Event()  # set while no connection is open
        self._unconnected.set()
        self.ever_connected = False  # a client has connected at least once
        self._tg: asyncio.TaskGroup | None = None
        self._runner: asyncio.Task | None = None
        self._stop: asyncio.Event | None = None
        self._tasks: set[asyncio.Task] = set()  # the handler tasks (owned by the TaskGroup)
        self.address = ""

    async def start(self, host: str, port: int) -> str:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, type_, proto, _, sockaddr = infos[0]
        listener = socket.socket(family, type_, proto)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(sockaddr)
            listener.listen(1024)
            listener.setblocking(False)
        except BaseException:
            listener.close()
            raise
        self._listener = listener
        bound_host, bound_port = listener.getsockname()[:2]
        self.address = f"{bound_host}:{bound_port}"
        self._stop = asyncio.Event()
        started = loop.create_future()
        self._runner = asyncio.create_task(self._run(started), name="request-plane-server")
        await started
        loop.add_reader(listener.fileno(), self._on_accept)
        return self.address

    async def _run(self, started: asyncio.Future) -> None:
        assert self._stop is not None
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            started.set_result(None)
            await self._stop.wait()
        self._tg = None

    def _on_accept(self) -> None:
        listener = self._listener
        if listener is None:
            return
        for _ in range(64):
            try:
                sock, _addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("request plane accept failed: %s", exc)
                return
            try:
                # Explicitly, per accepted socket, both ways (the "server_nodelay" setting).
                set_nodelay(sock, self.settings.server_nodelay)
                self._connections.add(_ServerConnection(sock, self))
                self._unconnected.clear()
                self.ever_connected = True
            except OSError as exc:
                log.warning("request plane: dropping a connection: %s", exc)
                sock.close()

    def _forget(self, conn: _ServerConnection) -> None:
        self._connections.discard(conn)
        if not self._connections:
            self._unconnected.set()

    @property
    def connected(self) -> bool:
        """Whether a client (a frontend) has a connection open."""
        return bool(self._connections)

    async def wait_unconnected(self) -> None:
        """Until no connection is open (at once if none is)."""
        await self._unconnected.wait()

    def _spawn(self, request: dict, sink: StreamSink) -> None:
        tg = self._tg
        if tg is None:
            sink.end(error_end("unavailable", "worker is shutting down", 503))
            return
        task = tg.create_task(self._serve(request, sink))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, request: dict, sink: StreamSink) -> None:
        try:
            await self.handler(request, sink)
        except asyncio.CancelledError:
            sink.end(error_end("unavailable", "worker stopped while serving the request", 503))
            raise
        except Exception as exc:  # the handler's bug must not take the server down
            log.exception("request handler failed")
            sink.end(error_end("engine_error", f"worker failed: {exc}", 500))
            return
        if not sink.ended:
            sink.end(error_end("protocol", "worker handler ended without END", 500))

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        if self._listener is not None:
            loop.remove_reader(self._listener.fileno())
            self._listener.close()
            self._listener = None
        if self._runner is not None:
            # Cancel the handlers still running; each sends its END before it goes.
            for task in list(self._tasks):
                task.cancel()
            assert self._stop is not None
            self._stop.set()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
            self._runner = None
        await asyncio.sleep(0)  # let the final flush run
        for conn in list(self._connections):
            conn.close()
        self._connections.clear()
        self._unconnected.set()
