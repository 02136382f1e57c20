"""`lab sidecar`'s settings, defined once: its CLI and the launcher's sidecar argv come from here.

The timing defaults are `lab.shared.settings.SidecarTiming` / `DiscoveryTiming`, the socket one
`SocketSettings`. The sidecar (`lab.serve.sidecar.sidecar.Sidecar`) runs on these settings
themselves.
"""

from __future__ import annotations

from pydantic import model_validator

from lab.shared.config_cli import MAX_SECONDS, Settings, setting
from lab.shared.settings import (
    DEFAULT_LOG_LEVEL,
    LOG_LEVELS,
    DiscoveryTiming,
    SidecarTiming,
    SocketSettings,
)
from lab.wire.address import split_address

#: The smallest positive duration the timing options accept.
MIN_SECONDS = 0.001
#: How the sidecar's log line about its start-up wait for the engine begins, e.g. "waiting for
#: engine 127.0.0.1:5000: connection refused since 12:01:03, attempt 7" (`lab ps` shows the
#: latest one of a sidecar that is not ready yet).
STARTUP_WAIT_PREFIX = "waiting for engine"


def engine_address(value: str) -> str:
    split_address(value, allow_port_zero=False)  # ValueError names the problem
    return value


def listen_address(value: str) -> str:
    split_address(value, allow_port_zero=True)
    return value


def worker_id(value: str) -> str:
    if not value or "/" in value or value.startswith("."):
        raise ValueError(f"{value!r}: must be a file-name-safe id")
    return value


def discovery_spec(value: str) -> str:
    """The form only (file:DIR or etcd://...); `lab sidecar` checks an etcd spec in full."""
    scheme, sep, rest = value.partition(":")
    if scheme == "etcd" or (scheme == "file" and sep and rest):
        return value
    raise ValueError(f"{value!r}: expected file:DIR or etcd://HOST:PORT[/prefix]")


class SidecarSettings(Settings):
    """The `lab sidecar` command line."""

    engine: str = setting(None, "The engine's gRPC address (host:port).", required=True,
                          parse=engine_address)
    listen: str = setting(
        "127.0.0.1:0", "Request-plane listen address (port 0 = pick a free port; the ready line "
        "names it).", parse=listen_address)
    discovery: str = setting(None, "Registry: file:DIR or etcd://HOST:PORT[/prefix].",
                             required=True, parse=discovery_spec)
    worker_id: str = setting(
        "sidecar-0", "This worker's id in discovery (the launcher passes its process name).",
        parse=worker_id)
    server_nodelay: bool = setting(
        SocketSettings.server_nodelay, "TCP_NODELAY on accepted request-plane sockets (set "
        "explicitly either way).", on_off=True)
    grace_period: float = setting(
        SidecarTiming.grace_period_s, "Seconds to keep serving after withdrawing (SIGTERM), or "
        "to drain (engine lost).", ge=0, le=MAX_SECONDS)
    inflight_timeout: float = setting(
        SidecarTiming.inflight_timeout_s, "SIGTERM: seconds to wait for in-flight requests "
        "after the grace period.", ge=0, le=MAX_SECONDS)
    startup_deadline: float = setting(
        SidecarTiming.startup_deadline_s, "Seconds to wait for the engine to answer at start-up "
        "(then exit 1).", ge=MIN_SECONDS,
        le=MAX_SECONDS)
    connect_attempt_timeout: float = setting(
        SidecarTiming.connect_attempt_timeout_s, "Seconds per connection attempt; also the time "
        "the liveness watch has to open.", ge=MIN_SECONDS,
        le=MAX_SECONDS)
    retry_interval: float = setting(
        SidecarTiming.retry_interval_s, "Seconds between start-up connection attempts.",
        ge=MIN_SECONDS,
        le=MAX_SECONDS)
    heartbeat: float = setting(
        DiscoveryTiming.heartbeat_s, "Seconds between GetLoad polls / discovery record "
        "refreshes.", ge=MIN_SECONDS,
        le=MAX_SECONDS)
    ttl: float = setting(
        DiscoveryTiming.ttl_s, "Discovery record time-to-live in seconds (must exceed "
        "--heartbeat).", ge=MIN_SECONDS,
        le=MAX_SECONDS)
    stale_load: float = setting(
        SidecarTiming.stale_load_s, "Engine lost when no fresh GetLoad sample arrived for this "
        "long while busy.", ge=MIN_SECONDS,
        le=MAX_SECONDS)
    stall: float = setting(
        SidecarTiming.stall_s, "Seconds without token progress while requests are in flight "
        "(or, idle, without a GetLoad answer) after which the engine counts as stalled: the "
        "worker withdraws, its in-flight requests end retryable, and it registers again once "
        "the engine serves. Keep it above the longest prefill (a 32k-token prompt takes ~0.7 s "
        "at speedup 1).", ge=MIN_SECONDS,
        le=MAX_SECONDS)
    probe_timeout: float = setting(
        SidecarTiming.probe_timeout_s, "Bound of one readiness probe (a one-token canary "
        "generation; on a prefill engine a GetLoad whose timestamp advances). The worker "
        "registers only after a probe succeeds.", ge=MIN_SECONDS,
        le=MAX_SECONDS)
    keepalive: float = setting(
        SidecarTiming.keepalive_s, "Seconds the engine connection may stay quiet (nothing "
        "received) before the sidecar sends an HTTP/2 PING (grpcio's keepalive_time).",
        ge=MIN_SECONDS, le=MAX_SECONDS)
    keepalive_timeout: float = setting(
        SidecarTiming.keepalive_timeout_s, "Seconds a keepalive PING's ACK may take; past it the "
        "connection is declared dead and the worker leaves rotation until the engine serves "
        "again (grpcio's keepalive_timeout).", ge=MIN_SECONDS, le=MAX_SECONDS)
    log_level: str = setting(DEFAULT_LOG_LEVEL, "Log level (logs go to stderr).",
                             choices=LOG_LEVELS, case_sensitive=False)

    @model_validator(mode="after")
    def _ttl_exceeds_heartbeat(self) -> SidecarSettings:
        if self.ttl <= self.heartbeat:
            raise ValueError(f"--ttl {self.ttl:g} must exceed --heartbeat {self.heartbeat:g}")
        return self
