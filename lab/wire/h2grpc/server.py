"""`H2GrpcServer`: a drop-in for the part of `grpc.aio.Server` the mocker uses, on the batched
HTTP/2 connection of `conn.py`.

Registration takes the standard grpc objects (`grpc.RpcMethodHandler`, generic handlers from
`grpc.method_handlers_generic_handler`, the dicts generated `add_XServicer_to_server` passes), so
existing registration code works unchanged. Unary-unary and unary-stream; async (or plain)
handlers, async generators for streams. Every handler task belongs to the server's TaskGroup.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import grpc
import grpc.aio

from . import frames as f
from .conn import LOCAL_STREAM_WINDOW, H2Connection, Stream
from .messages import MessageError, split_messages
from .metadata import from_fields, to_fields

log = logging.getLogger("lab.wire.h2grpc")

_HEADERS_200 = f.encode_headers([(b":status", b"200"), (b"content-type", f.CONTENT_TYPE)])
_TRAILERS_OK = f.encode_headers([(b"grpc-status", b"0")])
_DEFAULT_MAX_RECEIVE = 4 * 1024 * 1024


class _HandlerCallDetails(NamedTuple):
    """What `GenericRpcHandler.service()` receives (same fields as grpc's)."""

    method: str
    invocation_metadata: tuple[tuple[str, str | bytes], ...]


def _status_block(
    code: grpc.StatusCode,
    details: str,
    metadata: Sequence[tuple[str, str | bytes]] = (),
    with_headers: bool = False,
) -> bytes:
    """Trailers (or a trailers-only response when `with_headers`)."""
    if code is grpc.StatusCode.OK and not details and not metadata and not with_headers:
        return _TRAILERS_OK
    fields: list[tuple[bytes, bytes]] = []
    if with_headers:
        fields += [(b":status", b"200"), (b"content-type", f.CONTENT_TYPE)]
    fields.append((b"grpc-status", str(code.value[0]).encode()))
    if details:
        fields.append((b"grpc-message", f.encode_message(details)))
    fields += to_fields(metadata)
    return f.encode_headers(fields)


class ServicerContext:
    """The per-call context a handler receives: the subset of `grpc.aio.ServicerContext` the
    mocker's handlers use (abort), `write` (grpc_health's stock servicer), plus what
    tests/wire/test_h2grpc.py checks arrives from the client (metadata, peer, deadline) and a
    done callback."""

    def __init__(
        self, st: _ServerStream, conn: _ServerConn, metadata: tuple, deadline: float | None
    ):
        self._st = st
        self._conn = conn
        self._metadata = metadata
        self._deadline = deadline
        self._code: grpc.StatusCode | None = None
        self._details = ""
        self._trailing: Sequence[tuple[str, str | bytes]] = ()
        self._aborted = False
        self._done = False
        self._callbacks: list[Callable[[Any], None]] = []

    async def abort(
        self,
        code: grpc.StatusCode,
        details: str = "",
        trailing_metadata: Sequence[tuple[str, str | bytes]] = (),
    ) -> None:
        """End the call with `code`/`details`; raises `grpc.aio.AbortError` like grpc.aio."""
        if code is grpc.StatusCode.OK:
            code = grpc.StatusCode.UNKNOWN  # grpc refuses OK in abort as well
        self._code, self._details, self._aborted = code, details, True
        if trailing_metadata:
            self._trailing = trailing_metadata
        raise grpc.aio.AbortError()

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self._metadata

    def peer(self) -> str:
        peer = self._conn.peername
        if isinstance(peer, tuple) and len(peer) >= 2:
            fam = "ipv6:[%s]" if ":" in peer[0] else "ipv4:%s"
            return f"{fam % peer[0]}:{peer[1]}"
        return "unix:" + str(peer)

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - self._conn.loop.time())

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        if self._done:
            callback(self)
        else:
            self._callbacks.append(callback)

    async def write(self, message: Any) -> None:
        """Streaming by `context.write` instead of yielding (grpc_health's stock aio servicer
        streams Watch this way)."""
        handler = self._st.handler
        ser = handler.response_serializer if handler is not None else None
        self._conn.send(self._st, ser(message) if ser is not None else message)
        if not self._conn.writable(self._st):
            await self._conn.wait_writable(self._st)

    def _finish(self) -> None:
        if self._done:
            return
        self._done = True
        for cb in self._callbacks:
            try:
                cb(self)
            except Exception:
                log.exception("h2grpc: a done callback failed")
        self._callbacks.clear()


class _ServerStream(Stream):
    __slots__ = (
        "ctx",
        "deadline_timer",
        "handler",
        "headers_sent",
        "method",
        "partial",
        "request",
        "status_sent",
        "task",
    )

    def __init__(self, sid: int, send_window: int) -> None:
        super().__init__(sid, send_window)
        self.method = ""
        self.handler: grpc.RpcMethodHandler | None = None
        self.partial: bytearray | None = None
        self.request: list[bytes] = []
        self.task: asyncio.Task[None] | None = None
        self.ctx: ServicerContext | None = None
        self.headers_sent = False
        self.status_sent = False
        self.deadline_timer: asyncio.TimerHandle | None = None


class _ServerConn(H2Connection):
    """One accepted connection: streams -> handler tasks in the server's TaskGroup."""

    def __init__(self, server: H2GrpcServer) -> None:
        super().__init__()
        self.server = server
        self.peername: Any = None
        self.last_sid = 0
        self.draining = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.peername = transport.get_extra_info("peername")
        self.server._conns.add(self)

    # -- inbound ------------------------------------------------------------------------------

    def on_headers(self, sid: int, headers: list[tuple[bytes, bytes]], end_stream: bool) -> None:
        st = self.streams.get(sid)
        if st is not None:  # request trailers: only END_STREAM matters
            if end_stream:
                st.ended_remote = True
                self._request_complete(st)  # type: ignore[arg-type]
            return
        if sid % 2 == 0 or sid <= self.last_sid:
            return  # closed or invalid stream id: ignore (a late frame of a reset stream)
        self.last_sid = sid
        st = _ServerStream(sid, self.new_send_window())
        if self.draining:
            self.write(f.rst_stream(sid, f.REFUSED_STREAM))
            return
        self.streams[sid] = st
        hdr = dict(headers)
        method = hdr.get(b":path", b"").decode("latin-1")
        st.method = method
        if hdr.get(b":method") != b"POST" or not hdr.get(b"content-type", b"").startswith(
            b"application/grpc"
        ):
            self.send_status(st, grpc.StatusCode.INTERNAL, "not a gRPC request")
            return
        metadata = from_fields(headers)
        handler = self.server._lookup(method, metadata)
        if handler is None:
            self.send_status(st, grpc.StatusCode.UNIMPLEMENTED, f"Method not found: {method}")
            if not end_stream:
                self.reset_later(st)
            return
        if handler.request_streaming:
            self.send_status(
                st,
                grpc.StatusCode.UNIMPLEMENTED,
                "client-streaming methods are not supported by h2grpc",
            )
            return
        st.handler = handler
        deadline = None
        timeout = hdr.get(b"grpc-timeout")
        if timeout is not None:
            seconds = f.parse_timeout(timeout)
            if seconds is not None:
                deadline = self.loop.time() + seconds
                st.deadline_timer = self.loop.call_at(deadline, self._deadline, st)
        st.ctx = ServicerContext(st, self, metadata, deadline)
        if end_stream:
            st.ended_remote = True
            self._request_complete(st)

    def on_data(self, st: Stream, payload: bytes, end_stream: bool) -> None:
        assert isinstance(st, _ServerStream)
        if st.handler is None or st.status_sent:
            if end_stream and st.ended_local and st.trailer is None:
                self.streams.pop(st.sid, None)  # both sides done
            return
        try:
            st.partial = split_messages(
                st.partial, payload, st.request.append, self.server.max_receive
            )
        except MessageError as exc:
            self.send_status(st, getattr(grpc.StatusCode, exc.status), exc.details)
            self.reset_later(st)
            return
        if st.recv_unacked >= LOCAL_STREAM_WINDOW // 4:
            self.ack_stream(st)
        if end_stream:
            self._request_complete(st)

    def reset_later(self, st: Stream) -> None:
        """We sent the status before the client finished sending: RST_STREAM(NO_ERROR) tells it
        to stop (gRPC's convention), and the stream is forgotten. Call after `send_status` with
        nothing queued."""
        if not st.ended_remote:
            self.write(f.rst_stream(st.sid, f.NO_ERROR))
        self.forget(st)

    def _request_complete(self, st: _ServerStream) -> None:
        if st.handler is None or st.task is not None or st.status_sent:
            return
        if len(st.request) != 1 or st.partial:
            self.send_status(
                st,
                grpc.StatusCode.INTERNAL,
                "Missing request message"
                if not st.request
                else "Too many or incomplete request messages",
            )
            return
        if self.server._stopping:  # its handlers are being cancelled: start no new one
            self.send_status(st, grpc.StatusCode.UNAVAILABLE, "server shutting down")
            return
        st.task = self.server._spawn(self._run(st), st.method)

    def on_rst(self, st: Stream, code: int) -> None:
        assert isinstance(st, _ServerStream)
        st.ended_remote = True
        self._cancel(st)
        self.forget(st)

    def on_goaway(self, last_sid: int, code: int, debug: bytes) -> None:
        self.draining = True  # the client will open no more streams here

    def lost(self, exc: Exception | None) -> None:
        self.server._conns.discard(self)
        for st in list(self.streams.values()):
            self._cancel(st)  # type: ignore[arg-type]
        self.streams.clear()

    def _cancel(self, st: _ServerStream) -> None:
        st.status_sent = True
        if st.deadline_timer is not None:
            st.deadline_timer.cancel()
        if st.task is not None and not st.task.done():
            st.task.cancel()
        elif st.ctx is not None:
            st.ctx._finish()

    def _deadline(self, st: _ServerStream) -> None:
        st.deadline_timer = None
        if st.status_sent:
            return
        self.drop_pending(st)  # the status goes out now, not behind data nobody waits for
        self.send_status(st, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        self.reset_later(st)
        self._cancel(st)

    # -- outbound -----------------------------------------------------------------------------

    def start_response(self, st: _ServerStream) -> None:
        if not st.headers_sent:
            st.headers_sent = True
            self.send_headers(st, _HEADERS_200)

    def send(self, st: _ServerStream, msg: bytes) -> None:
        if st.status_sent:
            return
        if not st.headers_sent:
            self.start_response(st)
        self.send_message(st, msg)

    def send_status(
        self,
        st: _ServerStream,
        code: grpc.StatusCode,
        details: str,
        metadata: Sequence[tuple[str, str | bytes]] = (),
    ) -> None:
        if st.status_sent or self.closed:
            return
        st.status_sent = True
        if st.deadline_timer is not None:
            st.deadline_timer.cancel()
            st.deadline_timer = None
        if st.headers_sent:
            block = _status_block(code, details, metadata)
        else:
            st.headers_sent = True
            block = _status_block(code, details, metadata, with_headers=True)
        self.send_headers(st, block, end_stream=True)

    def on_sent_end(self, st: Stream) -> None:
        if st.ended_remote:
            self.streams.pop(st.sid, None)

    # -- the handler task ---------------------------------------------------------------------

    async def _run(self, st: _ServerStream) -> None:
        """Run one call's handler, then send its status. Never raises anything but
        CancelledError (so the server's TaskGroup is never torn down by one call)."""
        handler = st.handler
        ctx = st.ctx
        assert handler is not None and ctx is not None
        code, details = grpc.StatusCode.OK, ""
        try:
            deser = handler.request_deserializer
            try:
                request = deser(st.request[0]) if deser is not None else st.request[0]
            except Exception:
                code, details = grpc.StatusCode.INTERNAL, "Exception deserializing request!"
                return
            st.request.clear()
            ser = handler.response_serializer
            if handler.response_streaming:
                await self._stream(st, handler.unary_stream(request, ctx), ser)
            else:
                response = handler.unary_unary(request, ctx)
                if inspect.isawaitable(response):
                    response = await response
                if not st.status_sent:
                    self.send(st, ser(response) if ser is not None else response)
        except grpc.aio.AbortError:
            pass
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        except Exception as exc:
            if not ctx._aborted:
                log.exception("h2grpc: handler for %s failed", st.method)
                code, details = grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc)}: {exc}"
        finally:
            if ctx._aborted or (ctx._code is not None and code is grpc.StatusCode.OK):
                code = ctx._code or grpc.StatusCode.UNKNOWN
                details = ctx._details
            elif code is grpc.StatusCode.OK and ctx._details:
                details = ctx._details
            if code is grpc.StatusCode.CANCELLED:
                # RST/deadline/lost connection already ended the stream; a server stop did not
                if not st.status_sent:
                    self.send_status(st, grpc.StatusCode.UNAVAILABLE, "server shutting down")
            else:
                self.send_status(st, code, details, ctx._trailing)
            ctx._finish()

    async def _stream(
        self, st: _ServerStream, result: Any, ser: Callable[[Any], bytes] | None
    ) -> None:
        """Pull messages from the handler and queue them; stop pulling while the stream is
        backed up (flow control), and always close an async generator (its `finally` runs)."""
        if hasattr(result, "__anext__"):
            try:
                async for item in result:
                    if st.status_sent:
                        break
                    self.send(st, ser(item) if ser is not None else item)
                    if st.pending or self._paused:
                        await self.wait_writable(st)
            finally:
                aclose = getattr(result, "aclose", None)
                if aclose is not None:
                    await aclose()
        elif inspect.isawaitable(result):
            await result  # a handler that streams with `context.write`
        elif result is not None:
            for item in result:
                if st.status_sent:
                    break
                self.send(st, ser(item) if ser is not None else item)
                if st.pending or self._paused:
                    await self.wait_writable(st)

    def goaway(self) -> None:
        self.draining = True
        self.write(f.goaway(self.last_sid, f.NO_ERROR))


class H2GrpcServer:
    """Drop-in for the `grpc.aio.Server` subset the mocker uses.

    server = H2GrpcServer(options=None)
    port = server.add_insecure_port("127.0.0.1:0")   # binds now, returns the port
    server.add_generic_rpc_handlers(handlers); server.add_registered_method_handlers(svc, d)
    await server.start(); await server.stop(grace); await server.wait_for_termination()
    """

    def __init__(self, options: Iterable[tuple[str, Any]] | None = None) -> None:
        opts = dict(options or ())
        self.max_receive: int = int(
            opts.get("grpc.max_receive_message_length", _DEFAULT_MAX_RECEIVE)
        )
        self._generic: list[grpc.GenericRpcHandler] = []
        self._registered: dict[str, grpc.RpcMethodHandler] = {}
        self._socks: list[socket.socket] = []
        self._servers: list[asyncio.Server] = []
        self._conns: set[_ServerConn] = set()
        self._tg: asyncio.TaskGroup | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._serve_task: asyncio.Task[None] | None = None
        self._stop_event: asyncio.Event | None = None
        self._started = False
        self._stopping = False

    # -- registration -------------------------------------------------------------------------

    def add_generic_rpc_handlers(
        self, generic_rpc_handlers: Iterable[grpc.GenericRpcHandler]
    ) -> None:
        self._generic.extend(generic_rpc_handlers)

    def add_registered_method_handlers(
        self, service_name: str, method_handlers: Mapping[str, grpc.RpcMethodHandler]
    ) -> None:
        for name, handler in method_handlers.items():
            self._registered[f"/{service_name}/{name}"] = handler

    def _lookup(self, method: str, metadata: tuple) -> grpc.RpcMethodHandler | None:
        handler = self._registered.get(method)
        if handler is not None:
            return handler
        details = _HandlerCallDetails(method, metadata)
        for generic in self._generic:
            handler = generic.service(details)
            if handler is not None:
                return handler
        return None

    # -- lifecycle ----------------------------------------------------------------------------

    def add_insecure_port(self, address: str) -> int:
        """Bind a listening socket now (accepting starts at `start()`); return its port."""
        host, port = f.split_target(address)
        if host in ("", "::", "0.0.0.0") or address.startswith("[::]"):
            sock = socket.socket(socket.AF_INET6 if host != "0.0.0.0" else socket.AF_INET)
            if sock.family == socket.AF_INET6:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            bind: tuple = ("::" if sock.family == socket.AF_INET6 else "0.0.0.0", port)
        else:
            fam, _, _, _, bind = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
            sock = socket.socket(fam, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(bind)
        sock.listen(1024)
        sock.setblocking(False)
        self._socks.append(sock)
        return sock.getsockname()[1]

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        ready = loop.create_future()
        self._serve_task = asyncio.create_task(self._serve(ready), name="h2grpc-server")
        await ready
        for sock in self._socks:
            self._servers.append(await loop.create_server(lambda: _ServerConn(self), sock=sock))

    async def _serve(self, ready: asyncio.Future[None]) -> None:
        assert self._stop_event is not None
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            ready.set_result(None)
            await self._stop_event.wait()
        self._tg = None

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[None]:
        assert self._tg is not None
        task = self._tg.create_task(coro, name=f"h2grpc {name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def stop(self, grace: float | None) -> None:
        """Stop accepting, GOAWAY every connection, give in-flight calls `grace` seconds, then
        cancel them and close the connections. Returns when nothing of the server runs."""
        if self._stopping or not self._started:
            if self._serve_task is not None:
                await asyncio.shield(self._serve_task)
            return
        self._stopping = True
        for srv in self._servers:
            srv.close()
        for conn in list(self._conns):
            conn.goaway()
        if grace and self._tasks:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    while self._tasks:
                        await asyncio.wait(list(self._tasks))
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks))
        for conn in list(self._conns):
            conn.flush()
            if conn.transport is not None:
                conn.transport.close()
        assert self._stop_event is not None and self._serve_task is not None
        self._stop_event.set()
        await self._serve_task
        for srv in self._servers:
            await srv.wait_closed()
        for sock in self._socks:
            sock.close()

    async def wait_for_termination(self, timeout: float | None = None) -> bool:
        """True once the server stopped; False if `timeout` passed first (like grpc.aio)."""
        if self._serve_task is None:
            return True
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(self._serve_task)
        except TimeoutError:
            return False
        return True
