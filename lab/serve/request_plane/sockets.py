"""A framed connection on a raw non-blocking socket, with the write pattern under our control.

Why raw sockets rather than asyncio transports: the Nagle experiments need to know exactly which
send() syscalls happen. asyncio and uvloop transports buffer, merge (uvloop joins the writes of a
loop iteration into one writev) and set TCP_NODELAY on their own. Here:

* `queue_frame`: every frame queued on one connection during one loop iteration goes out in ONE
  send() at the start of the next iteration (`loop.call_soon` flush). While the kernel buffer
  is full, queued frames wait and go out with the backlog (each still its own frame).
* `write_split`: header and body as two send() calls, each at once (the "split writes" arm).
* TCP_NODELAY is whatever the owner set with `set_nodelay`; nothing here changes it.
"""

from __future__ import annotations

import asyncio
import socket

from lab.serve.request_plane.frames import FrameError, FrameReader

RECV_SIZE = 256 * 1024


def set_nodelay(sock: socket.socket, on: bool) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1 if on else 0)


class FramedConnection:
    """Base class: subclasses implement `frame_received` and `connection_lost`."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self._loop = asyncio.get_running_loop()
        self.sock = sock
        self._fd = sock.fileno()
        self._reader = FrameReader()
        self._queue: list[bytes] = []
        self._flush_scheduled = False
        self._backlog = bytearray()
        self.closed = False
        self._loop.add_reader(self._fd, self._on_readable)

    # -- subclass hooks -------------------------------------------------------------------------

    def frame_received(self, ftype: int, stream_id: int, payload: bytes) -> None:
        raise NotImplementedError

    def connection_lost(self, exc: BaseException | None) -> None:
        raise NotImplementedError

    # -- writing --------------------------------------------------------------------------------

    def queue_frame(self, frame: bytes) -> None:
        if self.closed:
            return
        self._queue.append(frame)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def write_split(self, header: bytes, body: bytes) -> None:
        """Header and body as two send() calls (after flushing what is queued, to keep order)."""
        if self.closed:
            return
        if self._queue and not self._backlog:
            self._write_now(self._take_queue())
        self._write_now(header)
        self._write_now(body)

    def _take_queue(self) -> bytes:
        queue = self._queue
        data = queue[0] if len(queue) == 1 else b"".join(queue)
        queue.clear()
        return data

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self.closed or self._backlog or not self._queue:
            return  # with a backlog, _on_writable sends the queue with it
        self._write_now(self._take_queue())

    def _write_now(self, data: bytes) -> None:
        if self.closed or not data:
            return
        if self._backlog:
            self._backlog += data
            return
        try:
            n = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError as exc:
            self.close(exc)
            return
        if n < len(data):
            self._backlog += memoryview(data)[n:]
            self._loop.add_writer(self._fd, self._on_writable)

    def _on_writable(self) -> None:
        if self._queue:
            self._backlog += self._take_queue()
        try:
            n = self.sock.send(self._backlog)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.close(exc)
            return
        del self._backlog[:n]
        if not self._backlog:
            self._loop.remove_writer(self._fd)

    # -- reading --------------------------------------------------------------------------------

    def _on_readable(self) -> None:
        try:
            data = self.sock.recv(RECV_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.close(exc)
            return
        if not data:
            self.close(None)
            return
        try:
            frames = self._reader.feed(data)
        except FrameError as exc:
            self.close(exc)
            return
        for ftype, stream_id, payload in frames:
            if self.closed:
                return
            self.frame_received(ftype, stream_id, payload)

    # -- closing --------------------------------------------------------------------------------

    def close(self, exc: BaseException | None = None) -> None:
        """Idempotent. Sends what is queued (best effort, non-blocking), then closes."""
        if self.closed:
            return
        if exc is None and self._queue and not self._backlog:
            self._write_now(self._take_queue())
            if self.closed:
                return
        self.closed = True
        self._loop.remove_reader(self._fd)
        if self._backlog:
            self._loop.remove_writer(self._fd)
            self._backlog.clear()
        self._queue.clear()
        self.sock.close()
        self.connection_lost(exc)
