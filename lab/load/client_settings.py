"""The load client's settings, defined once: the options of `lab sweep` (each field one flag)
and what the client runs on (`lab.load.client.run_level` takes this model itself). The values
a sweep fills in per level (`duration_s`, `request_id_prefix`, `start_at_ns`) are fields too,
but no option (`run_value`): the sweep sets them with `model_copy(update=...)`."""

from __future__ import annotations

from pydantic import model_validator

from lab.load.cancel import FIRST, CancelPlan, parse_cancel_after
from lab.shared.config_cli import MAX_SECONDS, MAX_SEED, Settings, run_value, setting

#: The most requests in flight one level may ask for (--conc, --max-concurrency): each holds a
#: connection and its buffers.
MAX_CONCURRENCY = 10_000

#: The most client processes one level may be spread over.
MAX_CLIENT_PROCS = 256


class ClientSettings(Settings):
    """How the load client sends (per request and per process)."""

    client_procs: int = setting(
        1, "Spread each level over K client processes.", ge=1,
        le=MAX_CLIENT_PROCS, metavar="K")
    fresh_connection: bool = setting(
        False, "Open a new HTTP connection per request (default: "
        "keep-alive, one pool).")
    in_process_client: bool = setting(
        False, "Run the load client inside the sweep process (default: a child "
        "process, so the client's CPU and loop-lag figures are its own, not the launcher's).")
    client_realtime: bool = setting(
        False, "Run the load client processes at real-time priority (SCHED_RR, the lowest "
        "level; needs root or CAP_SYS_NICE): beside a server that keeps the cores busy, a "
        "normal-priority client can wait up to a second for a core and stamp that wait into "
        "TTFT and ITL (docs/fidelity.md \"The client's scheduling\").")
    gap_ms: float = setting(
        0.0, "Idle time between a slot's response and its next request.", ge=0,
        le=MAX_SECONDS * 1000)
    timeout: float = setting(
        600.0, "Per-request timeout (also bounds the --target probe, at most "
        "30 s).", gt=0, le=MAX_SECONDS, metavar="SECONDS")
    cancel: float = setting(
        0.0, "Close this fraction of the requests mid-stream, as users who leave do (chosen by "
        "--cancel-seed; after each level of a launched stack the lab checks that every process "
        "let go of them).", ge=0, le=1, metavar="FRACTION")
    cancel_after: str = setting(
        FIRST, "When a cancelled request is closed: 'first' (its first token), 'Ntok' (after N "
        "tokens) or 'Tms' (T ms after it was sent).", parse=parse_cancel_after, metavar="WHEN")
    cancel_seed: int = setting(0, "Seed of which requests --cancel picks.", ge=0, le=MAX_SEED)

    http_nodelay: bool = run_value(True, "TCP_NODELAY on the client's HTTP sockets.")
    duration_s: float | None = run_value(
        None, "A timed level: stop claiming new requests after this long.")
    request_id_prefix: str = run_value(
        "", "request_id = prefix + index (also sent as X-Request-Id).")
    start_at_ns: int | None = run_value(
        None, "Start the level at this perf_counter_ns (system-wide on Linux), if the client "
        "is ready by then: N client shards that met at a barrier start their first level "
        "together.")
    # --ramp-up: a closed-loop level starts its slots spread over this long; what is claimed
    # before it ends is warm-up, and `after_ramp` more requests are sent after it (the bodies
    # are then an endless lazy set, built on demand; docs/open-loop.md "Ramp-up")
    ramp_up_s: float = run_value(0.0, "Spread a closed-loop level's slots over this long.")
    after_ramp: int | None = run_value(None, "Requests a ramped level sends after its ramp.")

    @model_validator(mode="after")
    def _realtime_needs_processes(self) -> ClientSettings:
        if self.client_realtime and self.in_process_client:
            raise ValueError("--client-realtime schedules the client processes: it cannot be "
                             "combined with --in-process-client")
        return self

    def cancels(self) -> CancelPlan | None:
        """The --cancel plan when it cancels anything (None: the plain send path)."""
        if self.cancel <= 0:
            return None
        return CancelPlan(self.cancel, self.cancel_after, self.cancel_seed)


#: What a level runs on when its caller gives no settings: the defaults, in this process (a
#: caller that measures the client's own CPU and loop lag passes settings of its own).
IN_PROCESS = ClientSettings(in_process_client=True)
