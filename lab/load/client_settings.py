"""The load client's settings on the command line (`lab sweep`), defined once: each field's default
comes from `lab.load.client.ClientOptions`, and `to_options()` is what the client runs on."""

from __future__ import annotations

from lab.load.cancel import FIRST, CancelPlan, parse_cancel_after
from lab.load.client import ClientOptions
from lab.shared.config_cli import MAX_SECONDS, MAX_SEED, Settings, setting

#: The most requests in flight one level may ask for (--conc, --max-concurrency): each holds a
#: connection and its buffers.
MAX_CONCURRENCY = 10_000

_DEFAULTS = ClientOptions()
#: The most client processes one level may be spread over.
MAX_CLIENT_PROCS = 256


class ClientSettings(Settings):
    """How `lab sweep`'s load client sends (per request and per process)."""

    client_procs: int = setting(
        _DEFAULTS.procs, "Spread each level over K client processes.", ge=1,
        le=MAX_CLIENT_PROCS, metavar="K")
    fresh_connection: bool = setting(
        _DEFAULTS.fresh_connection, "Open a new HTTP connection per request (default: "
        "keep-alive, one pool).")
    in_process_client: bool = setting(
        False, "Run the load client inside the sweep process (default: a child "
        "process, so the client's CPU and loop-lag figures are its own, not the launcher's).")
    gap_ms: float = setting(
        _DEFAULTS.gap_ms, "Idle time between a slot's response and its next request.", ge=0,
        le=MAX_SECONDS * 1000)
    timeout: float = setting(
        _DEFAULTS.timeout_s, "Per-request timeout (also bounds the --target probe, at most "
        "30 s).", gt=0, le=MAX_SECONDS, metavar="SECONDS")
    cancel: float = setting(
        0.0, "Close this fraction of the requests mid-stream, as users who leave do (chosen by "
        "--cancel-seed; after each level of a launched stack the lab checks that every process "
        "let go of them).", ge=0, le=1, metavar="FRACTION")
    cancel_after: str = setting(
        FIRST, "When a cancelled request is closed: 'first' (its first token), 'Ntok' (after N "
        "tokens) or 'Tms' (T ms after it was sent).", parse=parse_cancel_after, metavar="WHEN")
    cancel_seed: int = setting(0, "Seed of which requests --cancel picks.", ge=0, le=MAX_SEED)

    def to_options(self) -> ClientOptions:
        cancel = (CancelPlan(self.cancel, self.cancel_after, self.cancel_seed)
                  if self.cancel > 0 else None)
        return ClientOptions(fresh_connection=self.fresh_connection, gap_ms=self.gap_ms,
                             timeout_s=self.timeout, procs=self.client_procs,
                             isolate=not self.in_process_client, cancel=cancel)
