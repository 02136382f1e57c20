"""A minimal HTTP/1.1 client connection on asyncio.Protocol, for the load client's hot path.

Why not aiohttp: against a server that sends one SSE chunk per token, aiohttp wakes a coroutine
per chunk, and that dominates the client's CPU per request. Here the work per read is
done inside `data_received`: one `perf_counter_ns()` stamp, the chunked-encoding framing (a
`find` and an `int(.., 16)` per chunk), and appending (stamp, bytes). SSE events are split and
JSON is parsed later, off the hot path (`lab.load.sse`). The owner learns that a response is
complete through one callback per request.

Scope: one request at a time per connection (no pipelining), request bodies with Content-Length,
responses with chunked transfer-encoding, Content-Length, or read-until-close; 1xx interim
responses are skipped; keep-alive unless the server (or `Connection: close`) says otherwise.

Idle closes: a server closes a kept-alive connection after its keep-alive timeout (uvicorn: 5 s
in vLLM), and a request written into it as it closes is lost. Two defences, so no error the
server did not cause is reported: the owner retires a connection idle past the learned timeout
(`stale`, `lab.load.keep_alive`), and a request whose reused connection closed before any byte
of the response came back is resent once on a new connection (the callback then gets the new
connection; `RawResponse.resends` counts it). Never after a byte arrived: that request may have
run. Both cost nothing per request on the common path (a counter and a stamp already taken).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from lab.load.cancel import token_events
from lab.load.keep_alive import KeepAlive, keep_alive_for
from lab.load.sse import RawResponse

MAX_HEAD_BYTES = 64 * 1024  # response status line + headers
MAX_LINE_BYTES = 4 * 1024  # a chunk-size line or a trailer line

# body framing of the response being read
_HEAD, _CHUNKED, _LENGTH, _UNTIL_CLOSE, _IDLE = range(5)


class ProtocolError(Exception):
    """The server's bytes are not valid HTTP/1.1 as this client reads it."""


@dataclass(frozen=True)
class Origin:
    """Where requests go: scheme, host, port and the request target (path + query)."""

    scheme: str
    host: str
    port: int
    target: str

    @classmethod
    def from_url(cls, url: str) -> Origin:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http:// or https:// URL, got {url!r}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return cls(parts.scheme, parts.hostname, port, target)

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"

    def post_head(self, headers: dict[str, str]) -> bytes:
        """The constant part of a POST request head (ends before Content-Length)."""
        lines = [f"POST {self.target} HTTP/1.1", f"Host: {self.host_header}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        return ("\r\n".join(lines) + "\r\n").encode("latin-1")


def post_request(head: bytes, extra: bytes, body: bytes) -> bytes:
    """One request, ready for a single write: constant head, per-request header lines, body."""
    return b"%s%sContent-Length: %d\r\n\r\n%s" % (head, extra, len(body), body)


OnResponse = Callable[["Http1Connection", RawResponse, bool], None]


class Http1Connection(asyncio.Protocol):
    """One client connection. `request()` writes a request; `on_response(conn, raw, reusable)` is
    called exactly once when its response is complete or failed (then `raw.error_kind` is set).

    `raw` collects: `status`, and for a streamed 200 the decoded body pieces with the arrival
    stamp of the read that carried them (`raw.times`, `raw.pieces`); otherwise `raw.body`.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.raw: RawResponse | None = None
        self.on_response: OnResponse | None = None
        self._stream = False
        self._state = _IDLE
        self._head = b""  # response head bytes so far
        self._line = b""  # partial chunk-size / trailer line
        self._left = 0  # chunk data (or Content-Length body) bytes still to come
        self._crlf = 0  # bytes of the CRLF after chunk data still to skip
        self._trailer = False  # after the last chunk: reading trailer lines
        self._keep_alive = True
        self._body: list[bytes] = []
        self._timer: asyncio.TimerHandle | None = None
        self.served = 0  # responses completed: a connection that served one is being reused
        self.idle_since_ns = 0  # when the last response completed
        self.keep_alive: KeepAlive | None = None  # set by `connect`, with what a resend needs
        self._reconnect: tuple[Origin, bool, ssl.SSLContext | None] | None = None
        self._data = b""  # the request in flight (for a resend)
        self._timeout_s: float | None = None
        # --cancel (lab.load.cancel): the current request is to be closed mid-stream
        self._armed = False
        self._cancel_timer: asyncio.TimerHandle | None = None
        self._events_left = 0
        self._pending = b""  # an armed response's unterminated SSE event so far

    # ----- asyncio.Protocol -----

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        closed_by_us = self.closed
        self.closed = True
        if self.raw is None:
            if not closed_by_us and self.served and self.keep_alive is not None:
                self.keep_alive.saw_idle_close(time.perf_counter_ns() - self.idle_since_ns)
            return
        if self._state == _UNTIL_CLOSE:
            self._complete(time.perf_counter_ns())
        elif self._state == _HEAD and not self._head and self._can_resend():
            self._resend()
        else:
            what = "before the response" if self._state == _HEAD and not self._head else (
                "mid-response")
            self._fail("disconnect", f"server closed the connection {what}"
                       + (f": {exc}" if exc else ""))

    def eof_received(self) -> bool | None:
        return None  # close our side too; connection_lost follows

    def data_received(self, data: bytes) -> None:
        t = time.perf_counter_ns()
        state = self._state
        try:
            if state == _CHUNKED:
                self._chunked(data, t)
            elif state == _HEAD:
                self._read_head(data, t)
            elif state == _LENGTH:
                self._length(data, t)
            elif state == _UNTIL_CLOSE:
                self._piece(data, t)
            else:
                raise ProtocolError(f"{len(data)} unsolicited bytes from the server")
        except ProtocolError as exc:
            self._fail("protocol", str(exc))
        except ValueError as exc:
            self._fail("protocol", f"bad chunk size line: {exc}")

    # ----- requests -----

    def request(self, data: bytes, raw: RawResponse, streaming: bool, on_response: OnResponse,
                timeout_s: float | None = None) -> None:
        """Write one request (a single write). `raw.sent_ns` is the caller's to set."""
        if self.closed or self.transport is None or self.transport.is_closing():
            self.raw, self.on_response = raw, on_response
            self._stream, self._data, self._timeout_s = streaming, data, timeout_s
            if self._can_resend():
                self._resend()
            else:
                self._fail("disconnect", "connection closed before the request was sent")
            return
        self.raw = raw
        self.on_response = on_response
        self._data = data
        self._timeout_s = timeout_s
        self._stream = streaming
        self._state = _HEAD
        self._head = b""
        self._body = []
        self._keep_alive = True
        self.transport.write(data)  # first: the caller stamped the send just before
        if timeout_s:
            self._timer = asyncio.get_running_loop().call_later(timeout_s, self._timed_out,
                                                                timeout_s)

    def arm_cancel(self, raw: RawResponse, events: int | None, delay_s: float | None) -> None:
        """Leave the request `raw` mid-stream, as a user who goes away does: close the
        connection once `events` tokens of its response (SSE events with content,
        `lab.load.cancel.token_events`) have arrived, or `delay_s` seconds from now. The
        response then completes with `raw.cancelled_ns` stamped, unless it ended first. Per
        request, never per read: an armed request reads through `_counting_piece` (an
        instance attribute shadowing `_piece`), every other one through the plain path."""
        if self.raw is not raw:  # already failed or answered
            return
        self._armed = True
        if delay_s is not None:
            self._cancel_timer = asyncio.get_running_loop().call_later(delay_s, self._cancel)
        elif events is not None:
            self._events_left = events
            self._pending = b""
            self._piece = self._counting_piece  # type: ignore[method-assign]

    def _counting_piece(self, piece: bytes, t: int) -> None:
        Http1Connection._piece(self, piece, t)
        if not self._stream:
            return
        seen, self._pending = token_events(self._pending, piece)
        self._events_left -= seen
        if self._events_left <= 0 and b"[DONE]" not in piece:  # [DONE]: it finished anyway
            self._cancel(t)

    def _cancel(self, t: int | None = None) -> None:
        """Close the connection under the current request and complete it as cancelled."""
        self._cancel_timer = None
        raw, cb = self._detach()
        if raw is None or cb is None:
            return
        raw.cancelled_ns = raw.done_ns = t if t is not None else time.perf_counter_ns()
        if self._body and raw.body is None:
            raw.body = b"".join(self._body)
        self._body = []
        self.close()
        cb(self, raw, False)

    def _disarm(self) -> None:
        self._armed = False
        if self._cancel_timer is not None:
            self._cancel_timer.cancel()
            self._cancel_timer = None
        self.__dict__.pop("_piece", None)

    def stale(self, now_ns: int) -> bool:
        """Whether this kept-alive connection has been idle so long that the server may be
        closing it (its keep-alive timeout, less a margin): open a new one instead."""
        ka = self.keep_alive
        return (ka is not None and ka.retire_after_ns is not None and self.served > 0
                and now_ns - self.idle_since_ns >= ka.retire_after_ns)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def set_nodelay(self, on: bool) -> None:
        sock = self.transport.get_extra_info("socket") if self.transport else None
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1 if on else 0)

    # ----- response parsing -----

    def _read_head(self, data: bytes, t: int) -> None:
        head = self._head + data if self._head else data
        while True:
            end = head.find(b"\r\n\r\n")
            if end < 0:
                if len(head) > MAX_HEAD_BYTES:
                    raise ProtocolError(f"response head longer than {MAX_HEAD_BYTES} bytes")
                self._head = head
                return
            lines = head[:end].split(b"\r\n")
            rest = head[end + 4:]
            version, _, status_s = lines[0].partition(b" ")
            status_s = status_s[:3]
            if not version.startswith(b"HTTP/1.") or not status_s.isdigit():
                raise ProtocolError(f"bad status line {lines[0][:100]!r}")
            status = int(status_s)
            if 100 <= status < 200:  # interim response: the real one follows
                head = rest
                continue
            break
        self._head = b""
        chunked = False
        length: int | None = None
        keep_alive = version == b"HTTP/1.1"
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    raise ProtocolError(f"bad Content-Length {value[:40]!r}") from None
            elif name == b"connection":
                v = value.strip().lower()
                if v == b"close":
                    keep_alive = False
                elif v == b"keep-alive":
                    keep_alive = True
            elif name == b"keep-alive" and self.keep_alive is not None:
                self.keep_alive.heard(value)
        raw = self.raw
        assert raw is not None
        raw.status = status
        self._keep_alive = keep_alive
        self._stream = self._stream and status == 200
        if status in (204, 304):
            self._state = _IDLE
            self._complete(t)
        elif chunked:
            self._state = _CHUNKED
            self._line, self._left, self._crlf, self._trailer = b"", 0, 0, False
            if rest:
                self._chunked(rest, t)
        elif length is not None:
            self._state = _LENGTH
            self._left = length
            if length == 0:
                self._complete(t)
            elif rest:
                self._length(rest, t)
        else:
            self._state = _UNTIL_CLOSE
            self._keep_alive = False
            if rest:
                self._piece(rest, t)

    def _piece(self, piece: bytes, t: int) -> None:
        raw = self.raw
        if self._stream:
            raw.times.append(t)  # type: ignore[union-attr]
            raw.pieces.append(piece)  # type: ignore[union-attr]
        else:
            self._body.append(piece)

    def _length(self, data: bytes, t: int) -> None:
        n = len(data)
        if n > self._left:
            raise ProtocolError(f"{n - self._left} bytes beyond Content-Length")
        self._left -= n
        self._piece(data, t)
        if not self._left:
            self._complete(t)

    def _chunked(self, data: bytes, t: int) -> None:
        """Chunked transfer-encoding, incrementally: any split of the bytes across reads works."""
        pos = 0
        n = len(data)
        pieces: list[bytes] | None = None
        if not (self._left or self._crlf or self._line or self._trailer):
            # fast path: whole `size CRLF data CRLF` chunks at the start of this read
            find = data.find
            while True:
                eol = find(b"\r\n", pos)
                if eol < 0:
                    break
                size = int(data[pos:eol].split(b";", 1)[0], 16)
                start = eol + 2
                end = start + size
                if size <= 0 or end + 2 > n or data[end:end + 2] != b"\r\n":
                    break  # the last chunk, a chunk cut by the read, or an error: slow path
                if pieces is None:
                    pieces = [data[start:end]]
                else:
                    pieces.append(data[start:end])
                pos = end + 2
                if pos == n:
                    self._piece(pieces[0] if len(pieces) == 1 else b"".join(pieces), t)
                    return
        while pos < n:
            left = self._left
            if left:  # chunk data
                end = pos + left
                if end > n:
                    end = n
                piece = data if (pos == 0 and end == n) else data[pos:end]
                if pieces is None:
                    pieces = [piece]
                else:
                    pieces.append(piece)
                self._left = left - (end - pos)
                pos = end
                continue
            if self._crlf:  # the CRLF that ends chunk data
                k = min(self._crlf, n - pos)
                if data[pos:pos + k] != b"\r\n"[2 - self._crlf:2 - self._crlf + k]:
                    raise ProtocolError("chunk data not followed by CRLF")
                self._crlf -= k
                pos += k
                continue
            if self._line:  # a size or trailer line split across reads
                data = self._line + data[pos:]
                n = len(data)
                pos = 0
                self._line = b""
            eol = data.find(b"\r\n", pos)
            if eol < 0:
                if n - pos > MAX_LINE_BYTES:
                    raise ProtocolError("chunk-size line too long")
                self._line = data[pos:]
                break
            line = data[pos:eol]
            pos = eol + 2
            if self._trailer:
                if not line:  # the empty line after the last chunk: the response is complete
                    if pieces:
                        self._piece(pieces[0] if len(pieces) == 1 else b"".join(pieces), t)
                    if pos < n:  # bytes nobody asked for: do not reuse this connection
                        self._keep_alive = False
                    self._complete(t)
                    return
                continue  # a trailer field: ignored
            size = int(line.split(b";", 1)[0], 16)
            if size < 0:
                raise ProtocolError(f"negative chunk size {line[:40]!r}")
            if size == 0:
                self._trailer = True
            else:
                self._left = size
                self._crlf = 2
        if pieces:
            self._piece(pieces[0] if len(pieces) == 1 else b"".join(pieces), t)

    # ----- completion -----

    def _detach(self) -> tuple[RawResponse | None, OnResponse | None]:
        """End the current exchange: its response and callback, taken off the connection."""
        raw, cb = self.raw, self.on_response
        self.raw = self.on_response = None
        self._state = _IDLE
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._armed:
            self._disarm()
        return raw, cb

    def _complete(self, t: int) -> None:
        raw, cb = self._detach()
        if raw is None or cb is None:
            return
        if self._body:
            raw.body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
            self._body = []
        elif raw.body is None and not self._stream:
            raw.body = b""
        raw.done_ns = t
        self.served += 1
        self.idle_since_ns = t
        reusable = self._keep_alive and not self.closed
        if not reusable:
            self.close()
        cb(self, raw, reusable)

    def _fail(self, kind: str, message: str) -> None:
        raw, cb = self._detach()
        self.close()
        if raw is None or cb is None:
            return
        if self._body and raw.body is None:
            raw.body = b"".join(self._body)
        self._body = []
        raw.error_kind, raw.error_message = kind, message
        raw.done_ns = time.perf_counter_ns()
        cb(self, raw, False)

    def _can_resend(self) -> bool:
        """A request lost with a reused connection, nothing of its response read, not resent
        before, and a way to reconnect: the server closed an idle connection under it."""
        raw = self.raw
        return (self.served > 0 and self._reconnect is not None and raw is not None
                and not raw.resends)

    def _resend(self) -> None:
        raw, cb = self._detach()
        self.close()
        assert raw is not None and cb is not None and self._reconnect is not None
        raw.resends += 1
        task = asyncio.get_running_loop().create_task(
            _resend(self, self._reconnect, self._data, raw, self._stream, cb, self._timeout_s))
        _RESENDING.add(task)
        task.add_done_callback(_RESENDING.discard)

    def _timed_out(self, timeout_s: float) -> None:
        self._timer = None
        self._fail("timeout", f"no complete response within {timeout_s:g} s")


async def connect(origin: Origin, *, nodelay: bool, timeout_s: float | None = None,
                  ssl_context: ssl.SSLContext | None = None) -> Http1Connection:
    """Open a connection (TCP_NODELAY set explicitly either way). Raises OSError or
    TimeoutError."""
    loop = asyncio.get_running_loop()
    ctx = None
    if origin.scheme == "https":
        ctx = ssl_context or ssl.create_default_context()
    async with asyncio.timeout(timeout_s):
        _, conn = await loop.create_connection(Http1Connection, origin.host, origin.port,
                                               ssl=ctx)
    conn.set_nodelay(nodelay)
    conn.keep_alive = keep_alive_for(origin.scheme, origin.host, origin.port)
    conn._reconnect = (origin, nodelay, ssl_context)
    return conn


_RESENDING: set[asyncio.Task] = set()  # strong references to resends under way


async def _resend(old: Http1Connection, how: tuple[Origin, bool, ssl.SSLContext | None],
                  data: bytes, raw: RawResponse, streaming: bool, on_response: OnResponse,
                  timeout_s: float | None) -> None:
    """Send again, on a new connection, a request lost with a reused connection; within what is
    left of its timeout. A failed connect fails the request (reported with the old connection)."""
    origin, nodelay, ssl_context = how
    left = None
    if timeout_s:
        left = max(timeout_s - (time.perf_counter_ns() - raw.sent_ns) / 1e9, 1e-3)
    try:
        conn = await connect(origin, nodelay=nodelay, timeout_s=left, ssl_context=ssl_context)
    except (OSError, TimeoutError) as exc:
        raw.error_kind = "disconnect"
        raw.error_message = ("server closed the kept-alive connection before the response, "
                             f"and a new connection failed: {type(exc).__name__}: {exc}")
        raw.done_ns = time.perf_counter_ns()
        on_response(old, raw, False)
        return
    conn.request(data, raw, streaming, on_response, left)
