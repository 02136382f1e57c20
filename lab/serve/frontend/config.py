"""Frontend settings and their defaults (the CLI builds a FrontendConfig from its flags)."""

from __future__ import annotations

from dataclasses import dataclass, field

from lab.shared.settings import (
    DEFAULT_MIGRATION_LIMIT,
    DEFAULT_MODEL,
    DEFAULT_ROUTER,
    SocketSettings,
)

# Largest accepted request body; larger ones get 413.
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
# /v1/completions without max_tokens: the OpenAI default (chat leaves it to the sidecar, which
# derives it from the context window).
DEFAULT_COMPLETIONS_MAX_TOKENS = 16
# A connection with no request in progress (idle keep-alive, or request headers still arriving:
# slowloris) is closed after this long.
DEFAULT_IDLE_TIMEOUT_S = 60.0
# A request body must arrive within this long of its headers (a Content-Length lie gets 408).
DEFAULT_BODY_TIMEOUT_S = 30.0
# Open HTTP connections at most; one more is answered 503 and closed.
DEFAULT_MAX_CONNECTIONS = 4096
# SIGTERM: how long in-flight requests may take to finish before they are cut.
DEFAULT_SHUTDOWN_GRACE_S = 5.0
# A worker whose request-plane connection failed is skipped for this long (it may be restarting
# or about to expire from discovery).
WORKER_BACKOFF_S = 1.0


@dataclass(frozen=True)
class FrontendConfig:
    listen_host: str = "127.0.0.1"
    listen_port: int = 0
    discovery: str = ""
    router: str = DEFAULT_ROUTER
    sockets: SocketSettings = field(default_factory=SocketSettings)
    enforce_disagg: bool = False
    migration_limit: int = DEFAULT_MIGRATION_LIMIT
    # role -> minimum count for /health; empty = at least one worker of any role.
    expect: dict[str, int] = field(default_factory=dict)
    tokenizer: str | None = None
    model_name: str = DEFAULT_MODEL
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    shutdown_grace_s: float = DEFAULT_SHUTDOWN_GRACE_S
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    frontend_id: str = "frontend"
