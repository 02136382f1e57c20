"""Logging that a client cannot flood.

* `RateLimitedLog`: at most `burst` lines, refilled at `per_s` lines a second (a token bucket);
  the first line after a quiet spell says how many were suppressed. Tracebacks are kept only
  for the lines that pass.
* `BadRequestFilter` on aiohttp's `aiohttp.server` logger: a malformed HTTP request (aiohttp
  raises an HttpProcessingError: bad request line, bad header, oversized line, bad chunked
  encoding, ...) becomes one WARNING line without a traceback, rate-limited the same way.
  Anything else aiohttp logs passes unchanged.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError


class _Bucket:
    def __init__(self, per_s: float, burst: int) -> None:
        self.per_s = per_s
        self.burst = burst
        self.tokens = float(burst)
        self.stamp = time.monotonic()
        self.suppressed = 0

    def take(self) -> int | None:
        """None: suppress this line; else the number suppressed since the last one passed."""
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.per_s)
        self.stamp = now
        if self.tokens < 1.0:
            self.suppressed += 1
            return None
        self.tokens -= 1.0
        dropped, self.suppressed = self.suppressed, 0
        return dropped


class RateLimitedLog:
    def __init__(self, logger: logging.Logger, per_s: float = 1.0, burst: int = 10) -> None:
        self.logger = logger
        self._bucket = _Bucket(per_s, burst)

    def _emit(self, level: int, msg: str, *args: Any, exc_info: Any = None) -> None:
        dropped = self._bucket.take()
        if dropped is None:
            return
        if dropped:
            msg = f"{msg} ({dropped} similar lines suppressed)"
        self.logger.log(level, msg, *args, exc_info=exc_info)

    def error(self, msg: str, *args: Any, exc_info: Any = None) -> None:
        self._emit(logging.ERROR, msg, *args, exc_info=exc_info)

    def warning(self, msg: str, *args: Any) -> None:
        self._emit(logging.WARNING, msg, *args)


def _client_fault(exc: BaseException | None) -> BaseException | None:
    """The HttpProcessingError behind `exc` (itself, or what caused it: a corrupt gzip body
    surfaces as a payload error caused by a ContentEncodingError), else None."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, HttpProcessingError):
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


class BadRequestFilter(logging.Filter):
    """Install with `install_bad_request_filter()`."""

    def __init__(self, per_s: float = 1.0, burst: int = 10) -> None:
        super().__init__()
        self._bucket = _Bucket(per_s, burst)

    def filter(self, record: logging.LogRecord) -> bool:
        exc = _client_fault(record.exc_info[1] if record.exc_info else None)
        if exc is None:
            return True
        dropped = self._bucket.take()
        if dropped is None:
            return False
        message = str(getattr(exc, "message", "") or exc).replace("\n", " ")[:200]
        record.msg = "bad HTTP request (%d %s): %s%s"
        record.args = (
            getattr(exc, "code", 400) or 400,
            type(exc).__name__,
            message,
            f" ({dropped} similar lines suppressed)" if dropped else "",
        )
        record.levelno = logging.WARNING
        record.levelname = "WARNING"
        record.exc_info = None
        record.exc_text = None
        return True


def install_bad_request_filter() -> BadRequestFilter:
    """Once per process (idempotent)."""
    logger = logging.getLogger("aiohttp.server")
    for existing in logger.filters:
        if isinstance(existing, BadRequestFilter):
            return existing
    filt = BadRequestFilter()
    logger.addFilter(filt)
    return filt
