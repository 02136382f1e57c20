"""Per-request state shared by the Generate stream, the engine loop and Control.Abort.

The engine loop appends each pass's token to `tokens` at pass end and wakes the stream's
`waiter`; the stream sends each as its own TokenOutput (or `stream_interval` at a time).
`claimed` is the single claim of the reference (docs/mocker.md "Abort claim semantics"):
whichever of Abort, the stream's own terminal, the stall watchdog or an executor failure sets
it first decides how the stream ends.
"""

from __future__ import annotations

import asyncio
import enum


class Exit(enum.Enum):
    """How a stream ends; the terminal event is chosen from this in exactly one place."""

    COMPLETED = "completed"  # finished LENGTH (or PrefillReady on a prefill server)
    STOPPED = "stopped"  # finished STOP with stop_match
    REJECTED = "rejected"  # in-band INTERNAL: exceeds the simulated KV capacity
    ABORTED = "aborted"  # finished CANCELLED (Control.Abort won the claim)
    STALLED = "stalled"  # in-band OVERLOADED, retryable: consumer-stall watchdog
    FAILED = "failed"  # in-band INTERNAL: simulated executor failure
    MISSING_TOKEN = "missing_token"  # in-band INTERNAL: a signal without a token
    CLOSED = "closed"  # in-band INTERNAL: the engine went away without completing


class LiveRequest:
    __slots__ = (
        "aborted",
        "cached",
        "claimed",
        "completed",
        "done",
        "failure",
        "has_session",
        "key",
        "missing",
        "rejected",
        "reported_slow",
        "request_id",
        "slow",
        "stalled",
        "submitted",
        "tokens",
        "unacked",
        "waiter",
        "write_started",
    )

    def __init__(self, request_id: str, key: str, has_session: bool = False) -> None:
        self.request_id = request_id
        self.key = key
        self.has_session = has_session
        self.tokens: list[int] = []
        self.done = False  # the engine finished with it (completed, rejected, failed, closed)
        self.rejected = False
        self.completed = False  # the engine reported the last token
        self.missing = False
        self.cached = 0
        self.waiter: asyncio.Future[None] | None = None
        self.claimed = False
        self.aborted = False
        self.stalled = False
        self.failure: str | None = None
        self.submitted = False
        self.write_started = 0.0  # loop.time() while a write to the client is pending, else 0
        # Engine-loop pacing (engine_loop.py): handed a token it has not taken yet; or too
        # slow to be waited for until it catches up.
        self.unacked = False
        self.slow = False
        self.reported_slow = False

    def wake(self) -> None:
        w = self.waiter
        if w is not None:
            self.waiter = None
            if not w.done():
                w.set_result(None)

    def claim(self) -> bool:
        """Take the single claim; False if someone else already has it."""
        if self.claimed:
            return False
        self.claimed = True
        return True
