"""`--cancel FRACTION --cancel-after WHEN`: the client leaves some requests mid-stream, as a user
who closes the tab does (docs/reliability.md "Cancellation under load").

Which requests: a seeded choice per request index (`CancelPlan.picks`), so a level cancels the
same requests every time it is run with the same seed, whatever the client processes' split.
When: after the response's first token (`first`), after its N-th (`Ntok`), or T milliseconds
after the request was sent (`Tms`). Tokens are counted as SSE events that carry content
(non-empty `text`, `delta.content` or `token_ids`; `token_events`), the way the record counts
chunks: a role-only or usage-only event is none, and an event carrying several tokens counts
once. The client can only close after a read, so a read that brings several events may take
a request past its N-th token before it is closed; a request whose response ends in the read
that reaches its point is complete, not cancelled. Cancelling is closing the connection: the
server sees the client go away, which is all a user's browser can tell it.

The plan costs nothing per token: a request that is not picked runs the connection's plain
read path, and a picked one is armed once, when it is sent (`lab.load.http1`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: `--cancel-after`'s default: as soon as the first token arrives.
FIRST = "first"
_TOKENS = re.compile(r"^([1-9][0-9]{0,8})tok$")
_MS = re.compile(r"^([0-9]+(?:\.[0-9]+)?)ms$")
#: The longest `Tms` delay (a day): beyond any request's timeout.
MAX_CANCEL_MS = 86_400_000.0
_MASK = (1 << 64) - 1
#: An SSE event with content: non-empty text (completions), delta content (chat), token ids.
_CONTENT = re.compile(rb'"(?:text|content)":\s*"(?!")|"token_ids":\s*\[(?!\s*\])')


def token_events(pending: bytes, piece: bytes) -> tuple[int, bytes]:
    """The events with content completed by `piece` (after the unterminated `pending` of
    earlier reads), and the new unterminated rest."""
    events = (pending + piece).replace(b"\r\n", b"\n").split(b"\n\n")
    rest = events.pop()
    return sum(1 for ev in events if _CONTENT.search(ev)), rest


def parse_cancel_after(text: str) -> str:
    """The canonical spelling of a `--cancel-after` value; ValueError naming what is accepted."""
    value = str(text).strip().lower()
    if value == FIRST or _TOKENS.match(value):
        return value
    m = _MS.match(value)
    if m and float(m.group(1)) <= MAX_CANCEL_MS:
        return value
    raise ValueError(f"{text!r} is not a cancel delay: use 'first' (the first token), 'Ntok' "
                     f"(after N tokens, e.g. 8tok) or 'Tms' (T milliseconds after sending, "
                     f"0-{MAX_CANCEL_MS:.0f}, e.g. 250ms)")


def _mix(x: int) -> int:
    """splitmix64's finalizer: a cheap, well-spread 64-bit hash of an integer."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


@dataclass(frozen=True)
class CancelPlan:
    """Cancel `fraction` of the requests (chosen by `seed`), each `after` (a `--cancel-after`
    value) into its response."""

    fraction: float
    after: str = FIRST
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"cancel fraction must be in [0, 1], got {self.fraction!r}")
        object.__setattr__(self, "after", parse_cancel_after(self.after))

    @property
    def events(self) -> int | None:
        """Cancel once this many tokens (events with content) have arrived (None: a delay)."""
        if self.after == FIRST:
            return 1
        m = _TOKENS.match(self.after)
        return int(m.group(1)) if m else None

    @property
    def delay_s(self) -> float | None:
        """Cancel this long after the send (None: a token count)."""
        m = _MS.match(self.after)
        return float(m.group(1)) / 1000.0 if m else None

    def picks(self, index: int) -> bool:
        """Whether request `index` is one the client cancels (the same answer every run)."""
        if self.fraction <= 0.0:
            return False
        if self.fraction >= 1.0:
            return True
        return _mix(_mix(self.seed & _MASK) ^ index) < self.fraction * 2.0**64

    def to_dict(self) -> dict:
        return {"fraction": self.fraction, "after": self.after, "seed": self.seed}
