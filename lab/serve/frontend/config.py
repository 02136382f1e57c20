"""What the frontend runs on (`lab frontend` builds it from lab.shared.frontend_settings)."""

from __future__ import annotations

from dataclasses import dataclass, field

from lab.shared.frontend_settings import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_SHUTDOWN_GRACE_S,
)
from lab.shared.settings import (
    DEFAULT_MIGRATION_LIMIT,
    DEFAULT_MODEL,
    DEFAULT_ROUTER,
    SocketSettings,
)

# /v1/completions without max_tokens: the OpenAI default (chat leaves it to the sidecar, which
# derives it from the context window).
DEFAULT_COMPLETIONS_MAX_TOKENS = 16
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
    debug_endpoints: bool = False  # GET /debug/conn
    frontend_id: str = "frontend"
