"""Waiting on a condition in tests: the one `wait_for`.

Tests wait for what they mean (a record appeared, a process restarted, a stream was cancelled)
rather than sleeping a guessed time, so a loaded machine makes them slower, never wrong.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

Predicate = Callable[[], bool | Awaitable[bool]]


async def wait_for(
    predicate: Predicate,
    timeout: float = 5.0,
    what: str = "condition",
    *,
    interval: float = 0.01,
    in_thread: bool = False,
) -> float:
    """Await until `predicate()` is true; returns the seconds it took.

    `predicate` may be a plain function or return an awaitable; with `in_thread` a blocking
    predicate (an HTTP probe) runs in a worker thread so the event loop keeps serving.
    `interval` 0 checks once per event-loop turn. On timeout: AssertionError naming `what`.
    """
    start = time.monotonic()
    while True:
        if in_thread:
            result = await asyncio.to_thread(predicate)
        else:
            result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)
