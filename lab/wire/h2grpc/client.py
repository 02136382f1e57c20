"""`H2GrpcChannel`: a drop-in for the part of a `grpc.aio` channel the sidecar uses on the hot
path (`unary_stream`, `unary_unary`, `close`), on the batched HTTP/2 connection of `conn.py`.

Reads: `conn.data_received` parses a whole recv() in one pass; each DATA frame's messages are
appended to the call's deque, and the call's single waiter future exists (and is set) only while
its consumer is actually waiting - a consumer that keeps up takes messages without any future.
Errors surface as `grpc.aio.AioRpcError`; `call.cancel()` then iterating raises
`asyncio.CancelledError`, as grpc.aio does. With `grpc.keepalive_time_ms` among the options the
connection sends HTTP/2 PINGs when it goes quiet and is declared dead when one goes unanswered
(`keepalive.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Generator, Iterable
from typing import Any, Generic, TypeVar

import grpc
import grpc.aio

from . import frames as f
from .conn import LOCAL_STREAM_WINDOW, H2Connection, Stream
from .keepalive import Keepalive, KeepaliveSettings
from .messages import MessageError, split_messages
from .metadata import MetadataPairs, from_fields, to_fields

log = logging.getLogger("lab.wire.h2grpc")

_LOCAL_CANCEL = "Locally cancelled by application!"
_DEFAULT_MAX_RECEIVE = 4 * 1024 * 1024
#: Credit a stream's receive window once this much arrived - unless its consumer is behind.
_ACK_AT = LOCAL_STREAM_WINDOW // 4
#: Refusals (REFUSED_STREAM / GOAWAY) one call is retried for before it fails UNAVAILABLE.
MAX_TRANSPARENT_RETRIES = 8
#: A consumer with more messages than this buffered gets no more stream credit until it reads.
BEHIND_MESSAGES = 64

_HTTP_TO_STATUS = {
    400: grpc.StatusCode.INTERNAL,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.UNIMPLEMENTED,
    429: grpc.StatusCode.UNAVAILABLE,
    502: grpc.StatusCode.UNAVAILABLE,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.UNAVAILABLE,
}


class _ClientStream(Stream):
    __slots__ = ("call", "got_headers", "partial")

    def __init__(self, sid: int, send_window: int, call: _Call) -> None:
        super().__init__(sid, send_window)
        self.call = call
        self.partial: bytearray | None = None
        self.got_headers = False


class _ClientConn(H2Connection):
    """The channel's one connection: stream ids, header/data/status routing to calls."""

    is_client = True

    def __init__(self, channel: H2GrpcChannel) -> None:
        super().__init__()
        self.channel = channel
        self.next_sid = 1
        self.goaway_received = False
        self.dead: str | None = None  # why we declared the connection dead (keepalive)
        ka = channel._keepalive
        self.keepalive = Keepalive(self, ka, self._declare_dead) if ka is not None else None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self.keepalive is not None:
            self.keepalive.start()

    def on_ping_ack(self, payload: bytes) -> None:
        if self.keepalive is not None:
            self.keepalive.acked(payload)

    def _declare_dead(self, reason: str) -> None:
        """The peer stopped answering: abort (a close would wait for a write buffer that a
        stopped peer never drains); `lost` fails every call with `reason`."""
        log.warning("h2grpc: connection to %s declared dead: %s",
                    self.channel._authority.decode(), reason)
        self.dead = reason
        if self.transport is not None:
            self.transport.abort()

    @property
    def usable(self) -> bool:
        return not self.closed and not self.goaway_received and self.next_sid < 2**31 - 2

    def has_room(self) -> bool:
        """Below the server's SETTINGS_MAX_CONCURRENT_STREAMS (calls beyond it wait queued)."""
        return self.peer_max_streams is None or len(self.streams) < self.peer_max_streams

    def forget(self, st: Stream) -> None:
        super().forget(st)
        if self.channel._queued and self.channel._conn is self:
            self.channel._open_queued(self)

    def open(self, call: _Call) -> None:
        sid = self.next_sid
        self.next_sid += 2
        st = _ClientStream(sid, self.new_send_window(), call)
        self.streams[sid] = st
        call._st = st
        call._conn = self
        self.send_headers(st, call._block)
        self.send_message(st, call._request, end_stream=True)

    def on_headers(self, sid: int, headers: list[tuple[bytes, bytes]], end_stream: bool) -> None:
        st = self.streams.get(sid)
        if st is None:
            return
        assert isinstance(st, _ClientStream)
        call = st.call
        if not st.got_headers:
            st.got_headers = True
            hdr = dict(headers)
            status = hdr.get(b":status", b"")
            if status != b"200":
                code = _HTTP_TO_STATUS.get(int(status or 0), grpc.StatusCode.UNKNOWN)
                self._end(st, code, f"Received http2 header with status: {status.decode()}")
                return
            if not end_stream:
                call._initial = from_fields(headers)  # reported with an error status
                return
        if end_stream:
            hdr = dict(headers)
            raw = hdr.get(b"grpc-status")
            if raw is None:
                code, details = grpc.StatusCode.UNKNOWN, "missing grpc-status"
            else:
                code = f.status_from_int(int(raw))
                details = f.decode_message(hdr.get(b"grpc-message", b""))
            call._trailing = from_fields(headers)
            self._end(st, code, details, reset=False)

    def on_data(self, st: Stream, payload: bytes, end_stream: bool) -> None:
        assert isinstance(st, _ClientStream)
        call = st.call
        msgs = call._msgs
        try:
            st.partial = split_messages(st.partial, payload, msgs.append, call._max_receive)
        except MessageError as exc:
            self._end(st, getattr(grpc.StatusCode, exc.status), exc.details)
            return
        if st.recv_unacked >= _ACK_AT and len(msgs) <= BEHIND_MESSAGES:
            self.ack_stream(st)
        waiter = call._waiter
        if waiter is not None and msgs and not waiter.done():
            waiter.set_result(None)

    def on_rst(self, st: Stream, code: int) -> None:
        assert isinstance(st, _ClientStream)
        if code == f.REFUSED_STREAM and self._retry(st):
            return
        status = f.STATUS_BY_RST.get(code, grpc.StatusCode.INTERNAL)
        self._end(st, status, f"Received RST_STREAM with error code {code}", reset=False)

    def on_goaway(self, last_sid: int, code: int, debug: bytes) -> None:
        self.goaway_received = True
        self.channel._conn_done(self)
        for sid, st in list(self.streams.items()):
            if sid > last_sid:
                assert isinstance(st, _ClientStream)
                if not self._retry(st):
                    self._end(st, grpc.StatusCode.UNAVAILABLE, "GOAWAY received", reset=False)
        if not self.streams and self.transport is not None:
            self.transport.close()

    def _retry(self, st: _ClientStream) -> bool:
        """Transparent retry, as grpc-core does, of a stream the server never processed
        (REFUSED_STREAM, or above a GOAWAY's last stream id): the call goes back to the front of
        the channel's queue. False when it got a response already or retried too often."""
        call = st.call
        if st.got_headers or call._code is not None or call._retries >= MAX_TRANSPARENT_RETRIES:
            return False
        call._retries += 1
        self.forget(st)
        call._st = None
        call._conn = None
        self.channel._requeue(call)
        return True

    def lost(self, exc: Exception | None) -> None:
        if self.keepalive is not None:
            self.keepalive.stop()
        self.channel._conn_done(self)
        why = self.dead or exc or "closed"
        for st in list(self.streams.values()):
            assert isinstance(st, _ClientStream)
            st.call._finish(grpc.StatusCode.UNAVAILABLE, f"Connection lost: {why}")
        self.streams.clear()

    def on_sent_end(self, st: Stream) -> None:
        pass

    def _end(
        self, st: _ClientStream, code: grpc.StatusCode, details: str, reset: bool = True
    ) -> None:
        """Finish the call; RST the stream if the server may still be sending."""
        if reset and not st.ended_remote:
            self.write(f.rst_stream(st.sid, f.CANCEL))
        self.forget(st)
        st.call._finish(code, details)
        if self.goaway_received and not self.streams and self.transport is not None:
            self.flush()
            self.transport.close()

    def cancel_stream(self, st: _ClientStream) -> None:
        if st.sid in self.streams:
            if not st.ended_remote:
                self.write(f.rst_stream(st.sid, f.CANCEL))
            self.forget(st)


class _Call:
    """State shared by unary-stream and unary-unary calls."""

    def __init__(
        self,
        channel: H2GrpcChannel,
        block: bytes,
        request: bytes,
        deserializer: Callable[[bytes], Any] | None,
        timeout: float | None,
    ) -> None:
        self._channel = channel
        self._loop = channel._loop()
        self._block = block
        self._request = request
        self._deser = deserializer
        self._max_receive = channel._max_receive
        self._msgs: deque[bytes] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._code: grpc.StatusCode | None = None
        self._details = ""
        self._initial: tuple = ()
        self._trailing: tuple = ()
        self._locally_cancelled = False
        self._done_fut: asyncio.Future[None] | None = None
        self._st: _ClientStream | None = None
        self._conn: _ClientConn | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._retries = 0
        self._wait_for_ready = False
        if timeout is not None:
            self._timer = self._loop.call_later(timeout, self._on_deadline)

    # -- lifecycle ----------------------------------------------------------------------------

    def _finish(self, code: grpc.StatusCode, details: str) -> None:
        if self._code is not None:
            return
        self._code = code
        self._details = details
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if self._done_fut is not None and not self._done_fut.done():
            self._done_fut.set_result(None)

    def _abandon(self, code: grpc.StatusCode, details: str) -> None:
        st = self._st
        if st is not None and self._conn is not None:
            self._conn.cancel_stream(st)
        else:
            self._channel._unqueue(self)
        self._msgs.clear()
        self._finish(code, details)

    def _on_deadline(self) -> None:
        self._timer = None
        self._abandon(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")

    def cancel(self) -> bool:
        """Cancel the RPC (RST_STREAM CANCEL); False if it already finished."""
        if self._code is not None:
            return False
        self._locally_cancelled = True
        self._abandon(grpc.StatusCode.CANCELLED, _LOCAL_CANCEL)
        return True

    def cancelled(self) -> bool:
        return self._code is grpc.StatusCode.CANCELLED

    def done(self) -> bool:
        return self._code is not None

    async def _wait_done(self) -> None:
        if self._code is None:
            if self._done_fut is None:
                self._done_fut = self._loop.create_future()
            await asyncio.shield(self._done_fut)

    async def code(self) -> grpc.StatusCode:
        await self._wait_done()
        assert self._code is not None
        return self._code

    def _error(self) -> BaseException:
        if self._locally_cancelled:
            return asyncio.CancelledError()
        assert self._code is not None
        return grpc.aio.AioRpcError(
            self._code,
            grpc.aio.Metadata(*self._initial),
            grpc.aio.Metadata(*self._trailing),
            self._details,
        )

    async def _next_event(self) -> None:
        """Wait for a message or the status. Cancelling the waiting task cancels the RPC, as
        in grpc.aio."""
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        except asyncio.CancelledError:
            if self._code is None:
                self.cancel()
            raise
        finally:
            self._waiter = None

    async def _slow_next(self) -> bytes | None:
        """The next raw message, None at a clean end; raises the call's error."""
        while not self._msgs:
            if self._code is not None:
                if self._code is grpc.StatusCode.OK and not self._locally_cancelled:
                    return None
                raise self._error()
            st = self._st
            if st is not None and st.recv_unacked >= _ACK_AT and self._conn is not None:
                self._conn.ack_stream(st)
            await self._next_event()
        return self._msgs.popleft()


class UnaryStreamCall(_Call):
    """`async for msg in call`, `await call.read()` (grpc.aio.EOF at the end), `call.cancel()`."""

    def __aiter__(self) -> UnaryStreamCall:
        return self

    async def __anext__(self) -> Any:
        msgs = self._msgs
        if msgs and not self._locally_cancelled:
            raw = msgs.popleft()
        else:
            got = await self._slow_next()
            if got is None:
                raise StopAsyncIteration
            raw = got
        deser = self._deser
        return deser(raw) if deser is not None else raw

    async def read(self) -> Any:
        try:
            return await self.__anext__()
        except StopAsyncIteration:
            return grpc.aio.EOF


class UnaryUnaryCall(_Call):
    """`await call` -> the response."""

    def __await__(self) -> Generator[Any, None, Any]:
        return self._response().__await__()

    async def _response(self) -> Any:
        while self._code is None:
            await self._next_event()
        if self._code is not grpc.StatusCode.OK or self._locally_cancelled:
            raise self._error()
        if len(self._msgs) != 1:
            self._code = grpc.StatusCode.INTERNAL
            self._details = "expected exactly one response message"
            raise self._error()
        raw = self._msgs.popleft()
        return self._deser(raw) if self._deser is not None else raw


CallT = TypeVar("CallT", bound="_Call")
Serializer = Callable[[Any], bytes] | None
Deserializer = Callable[[bytes], Any] | None


class _MultiCallable(Generic[CallT]):
    """One method of the channel, called like grpc.aio's multi-callables; `call_class` says
    whether a call yields a stream of responses or awaits one."""

    call_class: type[CallT]

    def __init__(
        self,
        channel: H2GrpcChannel,
        method: str,
        request_serializer: Callable[[Any], bytes] | None,
        response_deserializer: Callable[[bytes], Any] | None,
    ) -> None:
        self._channel = channel
        self._ser = request_serializer
        self._deser = response_deserializer
        self._block = f.encode_headers(
            [
                (b":method", b"POST"),
                (b":scheme", b"http"),
                (b":path", method.encode()),
                (b":authority", channel._authority),
                (b"content-type", f.CONTENT_TYPE),
                (b"te", b"trailers"),
                (b"user-agent", b"h2grpc-python/0.1"),
            ]
        )

    def __call__(
        self,
        request: Any,
        *,
        timeout: float | None = None,
        metadata: MetadataPairs | None = None,
        wait_for_ready: bool | None = None,
        **_: Any,
    ) -> CallT:
        block = self._block
        extra: list[tuple[bytes, bytes]] = []
        if timeout is not None:
            extra.append((b"grpc-timeout", f.encode_timeout(timeout)))
        if metadata:
            extra += to_fields(metadata)
        if extra:
            block += f.encode_headers(extra)
        payload = self._ser(request) if self._ser is not None else request
        call = self.call_class(self._channel, block, payload, self._deser, timeout)
        call._wait_for_ready = bool(wait_for_ready)
        self._channel._submit(call)
        return call


class UnaryStreamMultiCallable(_MultiCallable[UnaryStreamCall]):
    call_class = UnaryStreamCall


class UnaryUnaryMultiCallable(_MultiCallable[UnaryUnaryCall]):
    call_class = UnaryUnaryCall


class H2GrpcChannel:
    """One lazily-connected TCP connection (TCP_NODELAY), reconnected after loss or GOAWAY.

    channel = H2GrpcChannel("127.0.0.1:PORT")
    call = channel.unary_stream("/pkg.Svc/M", request_serializer=..., response_deserializer=...)(
        request, timeout=None, metadata=None)
    async for msg in call: ...
    await channel.close()
    """

    def __init__(self, target: str, options: Iterable[tuple[str, Any]] | None = None) -> None:
        opts = dict(options or ())
        self._host, self._port = f.split_target(target)
        host = f"[{self._host}]" if ":" in self._host else self._host
        self._authority = f"{host}:{self._port}".encode()
        self._max_receive = int(opts.get("grpc.max_receive_message_length", _DEFAULT_MAX_RECEIVE))
        self._keepalive = KeepaliveSettings.from_options(opts)
        self._conn: _ClientConn | None = None
        self._connect_task: asyncio.Task[None] | None = None
        self._queued: list[_Call] = []
        self._closed = False
        self._failure: str | None = None  # set while connecting keeps failing
        self._ev_loop: asyncio.AbstractEventLoop | None = None

    def _loop(self) -> asyncio.AbstractEventLoop:
        if self._ev_loop is None:
            self._ev_loop = asyncio.get_running_loop()
        return self._ev_loop

    def unary_stream(self, method: str, request_serializer: Serializer = None,
                     response_deserializer: Deserializer = None, **_: Any
                     ) -> UnaryStreamMultiCallable:
        return UnaryStreamMultiCallable(self, method, request_serializer, response_deserializer)

    def unary_unary(self, method: str, request_serializer: Serializer = None,
                    response_deserializer: Deserializer = None, **_: Any
                    ) -> UnaryUnaryMultiCallable:
        return UnaryUnaryMultiCallable(self, method, request_serializer, response_deserializer)

    # -- connection management ----------------------------------------------------------------

    def _submit(self, call: _Call) -> None:
        if self._closed:
            call._finish(grpc.StatusCode.CANCELLED, "Channel closed!")
            return
        conn = self._conn
        if conn is not None and conn.usable:
            if conn.has_room():
                conn.open(call)
            else:
                self._queued.append(call)  # opened when a stream ends (`_ClientConn.forget`)
            return
        if self._failure is not None and not call._wait_for_ready:
            call._finish(grpc.StatusCode.UNAVAILABLE, self._failure)  # fail fast, like grpc
            return
        self._queued.append(call)
        if self._connect_task is None:
            self._connect_task = self._loop().create_task(self._connect(), name="h2grpc-connect")

    def _requeue(self, call: _Call) -> None:
        """A refused call: first in line. It opens when a stream ends (the server's stream
        count dropped), at once if nothing is in flight, or on a new connection."""
        self._queued.insert(0, call)
        conn = self._conn
        if conn is not None and conn.usable:
            if not conn.streams:
                self._open_queued(conn)
        elif self._connect_task is None:
            self._connect_task = self._loop().create_task(self._connect(), name="h2grpc-connect")

    def _unqueue(self, call: _Call) -> None:
        with contextlib.suppress(ValueError):
            self._queued.remove(call)

    async def _connect(self) -> None:
        """Connect; on failure fail the queued calls, except `wait_for_ready` ones, which wait
        for a later attempt (backoff 0.1 s growing to 1 s) until their deadline."""
        backoff = 0.1
        try:
            while True:
                try:
                    _, conn = await self._loop().create_connection(
                        lambda: _ClientConn(self), self._host, self._port
                    )
                    break
                except OSError as exc:
                    self._failure = f"failed to connect to all addresses: {exc}"
                    queued, self._queued = self._queued, []
                    for call in queued:
                        if call._code is not None:
                            continue
                        if call._wait_for_ready:
                            self._queued.append(call)
                        else:
                            call._finish(grpc.StatusCode.UNAVAILABLE, self._failure)
                    if not self._queued:
                        self._failure = None  # the next call tries again
                        return
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 1.6, 1.0)
        finally:
            self._connect_task = None
        self._failure = None
        self._conn = conn
        self._open_queued(conn)

    def _open_queued(self, conn: _ClientConn) -> None:
        while self._queued and conn.usable and conn.has_room():
            call = self._queued.pop(0)
            if call._code is None:
                conn.open(call)

    def _conn_done(self, conn: _ClientConn) -> None:
        if self._conn is conn:
            self._conn = None

    async def close(self, grace: float | None = None) -> None:
        """Cancel every call still running (CANCELLED "Channel closed!"), GOAWAY, close."""
        self._closed = True
        if self._connect_task is not None:
            self._connect_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._connect_task
        queued, self._queued = self._queued, []
        for call in queued:
            call.cancel()
        conn, self._conn = self._conn, None
        if conn is None or conn.closed:
            return
        for st in list(conn.streams.values()):
            assert isinstance(st, _ClientStream)
            st.call.cancel()  # as grpc.aio: a locally cancelled call (CancelledError to readers)
        conn.write(f.goaway(0, f.NO_ERROR))
        conn.flush()
        if conn.transport is not None:
            closed = conn.loop.create_future()
            conn.on_closed = closed
            conn.transport.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5):
                    await closed

    async def __aenter__(self) -> H2GrpcChannel:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
