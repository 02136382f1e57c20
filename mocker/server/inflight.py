"""Per-request state shared by the Generate stream, the engine loop and Control.Abort.

`LiveRequest` owns its transitions; the modules around it call its methods and write none of
its fields (the stream's `write_started` stamp and the engine loop's `submitted` mark aside):

* the engine loop `hand`s each pass's tokens (appended to `tokens`, the stream woken), marks a
  stream that stops taking them `mark_slow`, and `end`s it when the engine is finished with it
  (completed, rejected, a token missing, the engine gone);
* the stream `take`s its tokens, tells the loop it `took` them, and ends with `finish`;
* Control.Abort, the stall watchdog and an executor failure `claim` it with their exit.

`exit` says how the stream ends. None while the engine is still working on it; then how the
engine ended it (COMPLETED, REJECTED, MISSING_TOKEN, CLOSED), which is what the stream sends once
it has drained its tokens; and once `claimed`, the exit of whoever took the claim. The claim is
the single claim of the reference (docs/mocker.md "Abort claim semantics"): whichever of Abort,
the stream's own terminal, the stall watchdog or an executor failure takes it first decides how
the stream ends, so an abort racing a natural finish produces exactly one terminal. The
terminal event is built from `exit` in one place (`inference.terminal`).
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
        "cached",
        "claimed",
        "exit",
        "failure",
        "has_session",
        "key",
        "reported_slow",
        "request_id",
        "slow",
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
        #: Tokens handed by the engine loop and not taken by the stream yet (one per pass).
        self.tokens: list[int] = []
        self.exit: Exit | None = None
        self.claimed = False
        self.failure: str | None = None  # the executor failure's message (exit FAILED)
        self.cached = 0  # prompt tokens served from the prefix cache (the first signal says)
        self.waiter: asyncio.Future[None] | None = None
        self.submitted = False  # the engine loop gave it to the scheduler
        self.write_started = 0.0  # loop.time() while a write to the client is pending, else 0
        # Engine-loop pacing (engine_loop.py): handed tokens it has not taken yet; or too slow
        # to be waited for until it catches up (and whether that was logged).
        self.unacked = False
        self.slow = False
        self.reported_slow = False

    # ----- the engine loop -----------------------------------------------------------------------
    def hand(self, tokens: list[int]) -> int:
        """Give the stream the tokens of one pass or more (one each) and wake it. Returns 1 when
        the engine loop must now wait for it to take them (it was not awaited already and is not
        slow), else 0: the loop adds it to its count of streams it waits for."""
        self.tokens.extend(tokens)
        w = self.waiter
        if w is not None:
            self.waiter = None
            if not w.done():
                w.set_result(None)
        if self.unacked or self.slow:
            return 0
        self.unacked = True
        return 1

    def mark_slow(self) -> bool:
        """It did not take its tokens in time: no longer waited for. True the first time (the
        loop logs it once)."""
        self.unacked = False
        self.slow = True
        first = not self.reported_slow
        self.reported_slow = True
        return first

    def end(self, exit_: Exit) -> None:
        """The engine is finished with it: no more tokens will come. The stream sends `exit_`
        once it has drained them, unless someone claims it first."""
        if self.exit is None:
            self.exit = exit_
        self.wake()

    # ----- the stream ----------------------------------------------------------------------------
    def take(self, most: int) -> list[int]:
        """Up to `most` of the tokens handed to it, oldest first."""
        toks = self.tokens
        if most == 1:
            return [toks.pop(0)]
        step = toks[:most]
        del toks[:most]
        return step

    def took(self) -> int:
        """It took what it was handed (or went back to waiting, or is gone). Returns 1 when the
        engine loop was waiting for it. A slow stream that has caught up is waited for again."""
        if self.unacked:
            self.unacked = False
            return 1
        if self.slow and not self.tokens:
            self.slow = False
        return 0

    def replay(self, first_token: int, last: bool) -> None:
        """A decode leg: the prefill's first token goes out first; `last` when it is all the leg
        sends (max_tokens 1: the engine never ran it)."""
        self.tokens.insert(0, first_token)
        if last:
            self.end(Exit.COMPLETED)

    def finish(self, exit_: Exit | None) -> Exit:
        """The stream's own end: take the claim with `exit_` (None: it stopped because someone
        else claimed it). Returns the exit that decides: `exit_`, or the first claimer's."""
        if not self.claimed:
            self.claimed = True
            self.exit = exit_
        decided = self.exit
        assert decided is not None, "a claimed request has its exit"
        return decided

    # ----- Abort, the stall watchdog, an executor failure ------------------------------------
    def claim(self, exit_: Exit, failure: str | None = None) -> bool:
        """Take the single claim and end the stream with `exit_` (woken to send it); False if
        someone else already has it."""
        if self.claimed:
            return False
        self.claimed = True
        self.exit = exit_
        self.failure = failure
        self.wake()
        return True

    def wake(self) -> None:
        w = self.waiter
        if w is not None:
            self.waiter = None
            if not w.done():
                w.set_result(None)
