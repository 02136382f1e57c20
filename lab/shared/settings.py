"""Defaults of the serving path, defined once. The launcher and the CLIs read them from here."""

from __future__ import annotations

from dataclasses import dataclass

import pydantic
from pydantic import ConfigDict, Field

from lab.wire.constants import DEFAULT_MODEL, ROLES

__all__ = [
    "DEFAULT_LOG_LEVEL",
    "DEFAULT_MIGRATION_LIMIT",
    "DEFAULT_MODEL",
    "DEFAULT_ROUTER",
    "LOG_LEVELS",
    "MAX_POOL_SIZE",
    "ROLES",
    "ROUTERS",
    "DiscoveryTiming",
    "SidecarTiming",
    "SocketSettings",
]

#: `--log-level` of every process (case-insensitive on the command line; logs go to stderr).
LOG_LEVELS = ("debug", "info", "warning", "error")
DEFAULT_LOG_LEVEL = "info"

#: The frontend's worker-selection policies by CLI name (lab.serve.router.make_router).
ROUTERS = ("round-robin", "least-loaded", "random")
DEFAULT_ROUTER = "round-robin"

# Times a request whose worker failed mid-stream (retryable error, broken stream, a stalled
# engine) moves to another worker, continuing from the tokens already sent. One by default: a
# single lost or hung worker then costs no request, and a request can cost at most two engine
# runs (a poison request cannot walk the whole fleet). 0 = a worker failure reaches the client.
DEFAULT_MIGRATION_LIMIT = 1


#: The most persistent request-plane connections per worker.
MAX_POOL_SIZE = 1024


@pydantic.dataclasses.dataclass(frozen=True, config=ConfigDict(strict=True, extra="forbid"))
class SocketSettings:
    """The socket behaviour the Nagle experiments toggle, each setting on its own.

    client_nodelay: TCP_NODELAY on the frontend's request-plane client sockets.
    server_nodelay: TCP_NODELAY on the sidecar's accepted request-plane sockets.
    split_writes:   send a request frame as two writes (header, then body) instead of one.
    pool_size:      persistent request-plane connections per worker.
    http_nodelay:   TCP_NODELAY on the frontend's accepted HTTP client connections.
    """

    client_nodelay: bool = True
    server_nodelay: bool = True
    split_writes: bool = False
    pool_size: int = Field(default=2, ge=1, le=MAX_POOL_SIZE)
    http_nodelay: bool = True


@dataclass(frozen=True)
class DiscoveryTiming:
    heartbeat_s: float = 1.0
    ttl_s: float = 10.0


#: The sidecar's readiness canary's prompt (lab.serve.sidecar.progress): two ordinary token ids
#: (1000 + BLAKE3(word) mod 31000 range). Its length bounds the probe (launch.commands).
CANARY_PROMPT = (1000, 1001)


@dataclass(frozen=True)
class SidecarTiming:
    grace_period_s: float = 5.0
    inflight_timeout_s: float = 30.0
    startup_deadline_s: float = 120.0
    connect_attempt_timeout_s: float = 30.0
    retry_interval_s: float = 1.0
    load_poll_s: float = 1.0
    stale_load_s: float = 30.0
    # Progress-based liveness: requests in flight and no token for this long (or, idle, no
    # GetLoad answer) withdraws the worker. Well above a long prefill at speedup 1.
    stall_s: float = 2.0
    # One readiness probe (canary generation / GetLoad progress) before (re)registering.
    probe_timeout_s: float = 2.0
    # HTTP/2 keepalive on the engine connection (grpcio's keepalive_time / keepalive_timeout):
    # a PING after this long with nothing received, and the connection is dead when its ACK
    # takes longer than the timeout. A busy connection (tokens, the 1 s GetLoad) sends none.
    keepalive_s: float = 5.0
    keepalive_timeout_s: float = 5.0
