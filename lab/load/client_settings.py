"""The load client's settings, defined once: the options of `lab sweep` (each field one flag)
and what the client runs on (`lab.load.client.run_level` takes this model itself). The values
a sweep fills in per level (`duration_s`, `request_id_prefix`, `start_at_ns`) are fields too,
but no option (`run_value`): the sweep sets them with `model_copy(update=...)`."""

from __future__ import annotations

from lab.shared.config_cli import MAX_SECONDS, Settings, run_value, setting

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
    gap_ms: float = setting(
        0.0, "Idle time between a slot's response and its next request.", ge=0,
        le=MAX_SECONDS * 1000)
    timeout: float = setting(
        600.0, "Per-request timeout (also bounds the --target probe, at most "
        "30 s).", gt=0, le=MAX_SECONDS, metavar="SECONDS")
    http_nodelay: bool = run_value(True, "TCP_NODELAY on the client's HTTP sockets.")
    duration_s: float | None = run_value(
        None, "A timed level: stop claiming new requests after this long.")
    request_id_prefix: str = run_value(
        "", "request_id = prefix + index (also sent as X-Request-Id).")
    start_at_ns: int | None = run_value(
        None, "Start the level at this perf_counter_ns (system-wide on Linux), if the client "
        "is ready by then: N client shards that met at a barrier start their first level "
        "together.")


#: What a level runs on when its caller gives no settings: the defaults, in this process (a
#: caller that measures the client's own CPU and loop lag passes settings of its own).
IN_PROCESS = ClientSettings(in_process_client=True)
