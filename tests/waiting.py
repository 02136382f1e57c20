"""Waiting on a condition in tests: the one `wait_for`.

Tests wait for what they mean (a record appeared, a process restarted, a stream was cancelled)
rather than sleeping a guessed time, so a loaded machine makes them slower, never wrong.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

Predicate = Callable[[], bool | Awaitable[bool]]
T = TypeVar("T")


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


def wait_until(check: Callable[[], T | None], timeout: float = 5.0, what: str = "condition",
               *, interval: float = 0.05) -> T:
    """`wait_for` for a test without an event loop: polls `check()` until it returns a
    truthy value, and returns that value. On timeout: AssertionError naming `what`."""
    start = time.monotonic()
    while not (value := check()):
        if time.monotonic() - start > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)
    return value
