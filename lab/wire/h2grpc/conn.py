"""One HTTP/2 connection as an asyncio Protocol, shared by the server and the client.

It owns what both ends need and nothing gRPC-specific:

* **batched writes** - every frame is appended to one outbound list and the list is written with
  ONE `transport.write` from a `loop.call_soon` callback, i.e. after every task that was ready in
  this event-loop iteration has produced its frames. This is the point of the package: one engine
  step's tokens for all streams leave in one syscall.
* **one-pass reads** - `data_received` walks every whole frame of a recv() in one loop and
  dispatches it to the subclass hooks (`on_data`, `on_headers`, `on_rst`, `on_goaway`).
* **send flow control** - connection and per-stream send windows (SETTINGS_INITIAL_WINDOW_SIZE,
  WINDOW_UPDATE); data a window cannot take waits in the stream's `pending` queue, streams waiting
  for the connection window are served round-robin, and `wait_writable` lets a producer stop
  pulling messages while its stream (or the transport) is backed up.
* **receive windows** - a connection-level WINDOW_UPDATE once half the window was consumed;
  stream-level acknowledgement is the subclass's choice (`ack_stream`).
* PING ack, SETTINGS ack, CONTINUATION assembly, padding, max frame size, HPACK decoding.
* a `received` flag set by every recv() (one attribute store), which the client's keepalive
  reads to send PINGs only on a connection that has gone quiet (`client.py`, `Keepalive`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

import hpack

from . import frames as f

log = logging.getLogger("lab.wire.h2grpc")

#: Our receive windows: generous so a fast peer never waits on us; the stream window still bounds
#: what one stalled consumer can buffer.
LOCAL_STREAM_WINDOW = 1 << 20
LOCAL_CONN_WINDOW = 16 << 20
#: Outbound bytes after which a batch is written without waiting for the iteration's end (a
#: producer that never awaits must not build an unbounded buffer).
FLUSH_AT = 256 << 10


class PeerProtocolError(Exception):
    """The peer broke HTTP/2 at the connection level (RFC 9113 5.4.1: a bad frame size, flow
    control, HPACK...): raised while parsing, answered with GOAWAY(`code`), then close."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class Stream:
    """Per-stream send state plus the hooks' own fields (subclassed by server/client)."""

    __slots__ = (
        "drain",
        "ended_local",
        "ended_remote",
        "pending",
        "recv_unacked",
        "send_window",
        "sid",
        "trailer",
    )

    def __init__(self, sid: int, send_window: int) -> None:
        self.sid = sid
        self.send_window = send_window
        self.pending: deque[bytes | memoryview] = deque()
        self.trailer: list[bytes] | None = None  # END_STREAM HEADERS frames queued behind data
        self.drain: asyncio.Future[None] | None = None
        self.recv_unacked = 0
        self.ended_local = False
        self.ended_remote = False


class H2Connection(asyncio.Protocol):
    """Framing, batching and flow control for one connection; see the module docstring."""

    is_client = False

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}
        self.closed = False
        self._out: list[bytes | memoryview] = []
        self._out_bytes = 0
        self._flush_scheduled = False
        self._buf = b""
        self._preface_needed = not self.is_client
        self._peer_initial_window = f.DEFAULT_WINDOW
        self.peer_max_frame = f.DEFAULT_MAX_FRAME
        self.peer_max_streams: int | None = None
        self._conn_send_window = f.DEFAULT_WINDOW
        self._conn_recv_unacked = 0
        self._blocked: dict[int, Stream] = {}
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = 1 << 20
        self._cont: tuple[int, int, list[bytes]] | None = None  # (sid, flags, fragments)
        self._paused = False
        self._transport_waiters: list[Stream] = []
        self.on_closed: asyncio.Future[None] | None = None
        self.received = False  # set by every recv(); cleared by the keepalive that reads it

    # -- asyncio.Protocol -------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            import socket

            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        head = f.PREFACE if self.is_client else b""
        self.write(
            head
            + f.settings_frame(
                {
                    f.SETTINGS_ENABLE_PUSH: 0,
                    f.SETTINGS_INITIAL_WINDOW_SIZE: LOCAL_STREAM_WINDOW,
                    f.SETTINGS_MAX_HEADER_LIST_SIZE: 1 << 20,
                }
            )
            + f.window_update(0, LOCAL_CONN_WINDOW - f.DEFAULT_WINDOW)
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.transport = None
        self._out.clear()
        try:
            self.lost(exc)
        finally:
            if self.on_closed is not None and not self.on_closed.done():
                self.on_closed.set_result(None)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        waiters, self._transport_waiters = self._transport_waiters, []
        for st in waiters:
            self._wake(st)

    def data_received(self, data: bytes) -> None:
        self.received = True
        if self._buf:
            data = self._buf + data
            self._buf = b""
        if self._preface_needed:
            if len(data) < len(f.PREFACE):
                if not f.PREFACE.startswith(data):
                    self.abort_connection(f.PROTOCOL_ERROR, "bad preface")
                    return
                self._buf = data
                return
            if not data.startswith(f.PREFACE):
                self.abort_connection(f.PROTOCOL_ERROR, "bad preface")
                return
            self._preface_needed = False
            data = data[len(f.PREFACE) :]
        unpack = f.FRAME_HEADER.unpack_from
        pos = 0
        n = len(data)
        try:
            while n - pos >= 9:
                hi, lo, ftype, flags, sid = unpack(data, pos)
                end = pos + 9 + ((hi << 8) | lo)
                if end > n:
                    if end - pos > LOCAL_MAX_FRAME + 9:
                        raise PeerProtocolError(f.FRAME_SIZE_ERROR, "frame too large")
                    break
                sid &= 0x7FFFFFFF
                if self._cont is not None and ftype != f.CONTINUATION:
                    raise PeerProtocolError(f.PROTOCOL_ERROR, "expected CONTINUATION")
                if ftype == f.DATA:
                    self._data(sid, flags, data[pos + 9 : end])
                else:
                    self._control(ftype, flags, sid, data[pos + 9 : end])
                if self.closed:
                    return
                pos = end
        except PeerProtocolError as exc:
            self.abort_connection(exc.code, str(exc))
            return
        if pos < n:
            self._buf = data[pos:]

    # -- inbound frames ---------------------------------------------------------------------------

    def _data(self, sid: int, flags: int, payload: bytes) -> None:
        flow = len(payload)
        if flags & f.PADDED:
            payload = payload[1 : len(payload) - payload[0]]
        self._conn_recv_unacked += flow
        if self._conn_recv_unacked > LOCAL_CONN_WINDOW:
            raise PeerProtocolError(f.FLOW_CONTROL_ERROR, "connection receive window exceeded")
        if self._conn_recv_unacked >= LOCAL_CONN_WINDOW // 2:
            self.write(f.window_update(0, self._conn_recv_unacked))
            self._conn_recv_unacked = 0
        st = self.streams.get(sid)
        if st is None or st.ended_remote:
            return  # a stream we reset or forgot: the connection window is still credited
        st.recv_unacked += flow
        if st.recv_unacked > LOCAL_STREAM_WINDOW:
            self.write(f.rst_stream(sid, f.FLOW_CONTROL_ERROR))
            self.on_rst(st, f.FLOW_CONTROL_ERROR)
            return
        if flags & f.END_STREAM:
            st.ended_remote = True
        self.on_data(st, payload, bool(flags & f.END_STREAM))

    def _control(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        if ftype == f.HEADERS:
            if flags & f.PADDED:
                payload = payload[1 : len(payload) - payload[0]]
            if flags & f.PRIORITY_FLAG:
                payload = payload[5:]
            if flags & f.END_HEADERS:
                self._headers(sid, flags, payload)
            else:
                self._cont = (sid, flags, [payload])
        elif ftype == f.CONTINUATION:
            if self._cont is None or self._cont[0] != sid:
                raise PeerProtocolError(f.PROTOCOL_ERROR, "unexpected CONTINUATION")
            self._cont[2].append(payload)
            if flags & f.END_HEADERS:
                csid, cflags, parts = self._cont
                self._cont = None
                self._headers(csid, cflags, b"".join(parts))
        elif ftype == f.WINDOW_UPDATE:
            self._window_update(sid, f.u32(payload) & 0x7FFFFFFF)
        elif ftype == f.SETTINGS:
            if not flags & f.ACK:
                self._settings(payload)
        elif ftype == f.PING:
            if not flags & f.ACK:
                self.write(f.frame(f.PING, f.ACK, 0, payload))
            else:
                self.on_ping_ack(payload)
        elif ftype == f.RST_STREAM:
            st = self.streams.get(sid)
            if st is not None:
                self.on_rst(st, f.u32(payload))
        elif ftype == f.GOAWAY:
            self.on_goaway(f.u32(payload) & 0x7FFFFFFF, f.u32(payload, 4), payload[8:])
        # PRIORITY, PUSH_PROMISE (we disable push) and unknown types are ignored.

    def _headers(self, sid: int, flags: int, block: bytes) -> None:
        try:
            headers = self._decoder.decode(block, raw=True)
        except hpack.HPACKError as exc:
            raise PeerProtocolError(f.COMPRESSION_ERROR, f"HPACK: {exc}") from exc
        # raw=True: a list of (name, value) bytes pairs, whatever hpack annotates
        self.on_headers(sid, headers, bool(flags & f.END_STREAM))  # type: ignore[arg-type]

    def _settings(self, payload: bytes) -> None:
        for key, value in f.parse_settings(payload):
            if key == f.SETTINGS_INITIAL_WINDOW_SIZE:
                if value > f.MAX_WINDOW:
                    raise PeerProtocolError(f.FLOW_CONTROL_ERROR, "initial window too large")
                delta = value - self._peer_initial_window
                self._peer_initial_window = value
                for st in self.streams.values():
                    st.send_window += delta
            elif key == f.SETTINGS_MAX_FRAME_SIZE:
                if not f.DEFAULT_MAX_FRAME <= value <= 2**24 - 1:
                    raise PeerProtocolError(f.PROTOCOL_ERROR, "bad max frame size")
                self.peer_max_frame = value
            elif key == f.SETTINGS_MAX_CONCURRENT_STREAMS:
                self.peer_max_streams = value
        self.write(f.frame(f.SETTINGS, f.ACK, 0))
        self._pump_all()

    def _window_update(self, sid: int, inc: int) -> None:
        if sid == 0:
            self._conn_send_window += inc
            if self._conn_send_window > f.MAX_WINDOW:
                raise PeerProtocolError(f.FLOW_CONTROL_ERROR, "connection window overflow")
            self._pump_all()
            return
        st = self.streams.get(sid)
        if st is None:
            return
        st.send_window += inc
        if st.pending or st.trailer is not None:
            self._pump(st)

    # -- outbound ---------------------------------------------------------------------------------

    def write(self, data: bytes | memoryview) -> None:
        """Queue bytes for this iteration's single write."""
        self._out.append(data)
        self._out_bytes += len(data)
        if self._out_bytes >= FLUSH_AT:
            self.flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        self._flush_scheduled = False
        if not self._out:
            return
        out = self._out
        self._out = []
        self._out_bytes = 0
        if self.transport is not None:
            self.transport.write(b"".join(out))

    def new_send_window(self) -> int:
        return self._peer_initial_window

    def send_headers(self, st: Stream, block: bytes, end_stream: bool = False) -> None:
        """HEADERS for `st`; with end_stream they queue behind any data still waiting."""
        frames_ = f.header_frames(st.sid, block, end_stream, self.peer_max_frame)
        if end_stream:
            st.ended_local = True
            if st.pending:
                st.trailer = frames_
                return
        for fr in frames_:
            self.write(fr)
        if end_stream:
            self.on_sent_end(st)

    def send_message(self, st: Stream, msg: bytes, end_stream: bool = False) -> None:
        """One gRPC message on `st`: one DATA frame when the windows allow (the fast path), else
        queued on the stream and sent as the windows open. `end_stream` half-closes after it."""
        n = len(msg) + 5
        if (
            not st.pending
            and n <= st.send_window
            and n <= self._conn_send_window
            and n <= self.peer_max_frame
        ):
            st.send_window -= n
            self._conn_send_window -= n
            flags = f.END_STREAM if end_stream else 0
            self._out.append(
                f.DATA_AND_PREFIX.pack(n >> 8, n & 0xFF, f.DATA, flags, st.sid, 0, n - 5)
            )
            self.write(msg)
            if end_stream:
                st.ended_local = True
                self.on_sent_end(st)
            return
        st.pending.append(memoryview(f.MESSAGE_PREFIX.pack(0, n - 5) + msg))
        if end_stream:
            st.ended_local = True
            st.trailer = [f.frame(f.DATA, f.END_STREAM, st.sid)]
        self._pump(st)

    def writable(self, st: Stream) -> bool:
        """False while `st` has data waiting for a window or the transport is backed up: a
        producer must not pull its next message then."""
        return not st.pending and not self._paused

    async def wait_writable(self, st: Stream) -> None:
        while not self.closed and not self.writable(st):
            st.drain = self.loop.create_future()
            if self._paused:
                self._transport_waiters.append(st)
            try:
                await st.drain
            finally:
                st.drain = None

    def _wake(self, st: Stream) -> None:
        if st.drain is not None and not st.drain.done():
            st.drain.set_result(None)

    def _pump(self, st: Stream, max_frames: int = 1 << 30) -> bool:
        """Send what the windows allow of `st`'s pending data; True if a frame was sent."""
        sent = False
        pending = st.pending
        while pending and max_frames > 0:
            allowed = min(st.send_window, self._conn_send_window, self.peer_max_frame)
            if allowed <= 0:
                break
            chunk = pending[0]
            if len(chunk) <= allowed:
                pending.popleft()
            else:
                pending[0] = chunk[allowed:]
                chunk = chunk[:allowed]
            n = len(chunk)
            st.send_window -= n
            self._conn_send_window -= n
            self.write(f.FRAME_HEADER.pack(n >> 8, n & 0xFF, f.DATA, 0, st.sid))
            self.write(chunk)
            sent = True
            max_frames -= 1
        if pending:
            self._blocked[st.sid] = st
            return sent
        self._blocked.pop(st.sid, None)
        if st.trailer is not None:
            trailer, st.trailer = st.trailer, None
            for fr in trailer:
                self.write(fr)
            self.on_sent_end(st)
        self._wake(st)
        return sent

    def _pump_all(self) -> None:
        """Round-robin over the streams waiting for a window, one frame each per round, so one
        big message does not starve the others."""
        while self._blocked and self._conn_send_window > 0:
            progressed = False
            for st in list(self._blocked.values()):
                progressed |= self._pump(st, 1)
            if not progressed:
                break

    def drop_pending(self, st: Stream) -> None:
        """Abandon `st`'s queued data (it will never be sent)."""
        st.pending.clear()
        self._blocked.pop(st.sid, None)

    def forget(self, st: Stream) -> None:
        """Drop a finished or reset stream's state (its queued data is never sent)."""
        self.streams.pop(st.sid, None)
        self._blocked.pop(st.sid, None)
        st.pending.clear()
        st.trailer = None
        self._wake(st)

    def ack_stream(self, st: Stream) -> None:
        """Credit back what `st` received (stream-level WINDOW_UPDATE)."""
        if st.recv_unacked and not st.ended_remote:
            self.write(f.window_update(st.sid, st.recv_unacked))
        st.recv_unacked = 0

    def reset(self, st: Stream, code: int) -> None:
        self.write(f.rst_stream(st.sid, code))
        self.forget(st)

    def abort_connection(self, code: int, message: str) -> None:
        log.warning("h2grpc: connection error %d: %s", code, message)
        last = max(self.streams, default=0)
        self.write(f.goaway(last, code, message.encode()[:200]))
        self.flush()
        if self.transport is not None:
            self.transport.close()

    # -- hooks ------------------------------------------------------------------------------------

    def on_data(self, st: Stream, payload: bytes, end_stream: bool) -> None:
        raise NotImplementedError

    def on_headers(self, sid: int, headers: list[tuple[bytes, bytes]], end_stream: bool) -> None:
        raise NotImplementedError

    def on_rst(self, st: Stream, code: int) -> None:
        raise NotImplementedError

    def on_goaway(self, last_sid: int, code: int, debug: bytes) -> None:
        raise NotImplementedError

    def on_sent_end(self, st: Stream) -> None:
        """Our END_STREAM left (possibly after queued data)."""

    def on_ping_ack(self, payload: bytes) -> None:
        """The peer acknowledged one of our PINGs (RFC 9113 6.7)."""

    def lost(self, exc: Exception | None) -> None:
        raise NotImplementedError


#: We advertise the default max frame size; a larger inbound frame is a FRAME_SIZE_ERROR.
LOCAL_MAX_FRAME = f.DEFAULT_MAX_FRAME
