"""A sub-millisecond sleep for the engine loop: a Linux timerfd watched by the event loop.

Why: asyncio/uvloop timers have millisecond resolution (uvloop rounds the delay to whole ms and
checks it against a cached ms clock; epoll_wait takes a ms timeout), so `asyncio.sleep(d)` wakes
~0.7 ms late on average. The engine delivers a pass's tokens when it wakes at the pass end, so
that lateness lands on every TTFT (and on every token's timestamp). A timerfd armed with an
absolute CLOCK_MONOTONIC deadline (the clock `time.perf_counter` reads on Linux) makes epoll
return at the deadline itself: measured ~0.2 ms late, with no busy-waiting.

Falls back to `asyncio.sleep` where timerfd is unavailable (not Linux, no libc symbol).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
import sys
import time

log = logging.getLogger("mocker.server")

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = 0o4000
_TFD_CLOEXEC = 0o2000000
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc_timerfd():
    """(timerfd_create, timerfd_settime) from libc, or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        create = libc.timerfd_create
        settime = libc.timerfd_settime
    except (OSError, AttributeError):
        return None
    create.argtypes = [ctypes.c_int, ctypes.c_int]
    create.restype = ctypes.c_int
    settime.argtypes = [
        ctypes.c_int,
        ctypes.c_int,
        ctypes.POINTER(_Itimerspec),
        ctypes.c_void_p,
    ]
    settime.restype = ctypes.c_int
    return create, settime


class PreciseSleeper:
    """`await sleep_until_ns(deadline)` for ONE sleeper at a time (the engine loop task).

    Create and use it inside the running loop; `close()` when done.
    """

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._fd = -1
        self._settime = None
        self._spec = _Itimerspec()
        self._spec_ref = None
        self._waiter: asyncio.Future[None] | None = None
        funcs = _libc_timerfd()
        if funcs is None:
            return
        create, settime = funcs
        fd = create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            log.debug("timerfd_create failed (errno %d): using asyncio.sleep", ctypes.get_errno())
            return
        try:
            self._loop.add_reader(fd, self._on_fire)
        except (NotImplementedError, OSError):
            os.close(fd)
            return
        self._fd = fd
        self._settime = settime
        self._spec_ref = ctypes.byref(self._spec)

    @property
    def precise(self) -> bool:
        return self._fd >= 0

    def _on_fire(self) -> None:
        try:
            os.read(self._fd, 8)
        except (BlockingIOError, InterruptedError):
            return
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def sleep_until_ns(self, deadline_ns: int) -> None:
        """Sleep until time.perf_counter_ns() >= deadline_ns (returns at once if it already is)."""
        if self._fd < 0:
            await asyncio.sleep(max(0.0, (deadline_ns - time.perf_counter_ns()) / 1e9))
            return
        if deadline_ns <= time.perf_counter_ns():
            await asyncio.sleep(0)
            return
        value = self._spec.it_value
        value.tv_sec, value.tv_nsec = divmod(deadline_ns, 1_000_000_000)
        if self._settime(self._fd, _TFD_TIMER_ABSTIME, self._spec_ref, None) != 0:
            await asyncio.sleep(max(0.0, (deadline_ns - time.perf_counter_ns()) / 1e9))
            return
        waiter = self._loop.create_future()
        self._waiter = waiter
        try:
            await waiter
        finally:
            if self._waiter is waiter:  # cancelled: disarm so a stale expiry wakes nobody
                self._waiter = None

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            self._loop.remove_reader(fd)
            os.close(fd)
