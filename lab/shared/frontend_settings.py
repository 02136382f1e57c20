"""`lab frontend`'s settings, defined once: its CLI and the launcher's frontend argv come from
here, and the frontend (`lab.serve.frontend.server.FrontendServer`) runs on them."""

from __future__ import annotations

from pathlib import Path

from lab.shared.config_cli import MAX_SECONDS, Settings, setting
from lab.shared.reasoning import REASONING_PARSERS
from lab.shared.settings import (
    DEFAULT_LOG_LEVEL,
    DEFAULT_MIGRATION_LIMIT,
    DEFAULT_MODEL,
    DEFAULT_ROUTER,
    LOG_LEVELS,
    MAX_POOL_SIZE,
    ROLES,
    ROUTERS,
    DiscoveryTiming,
    SocketSettings,
)
from lab.wire.address import split_address

# Largest accepted request body; larger ones get 413.
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
# A connection with no request in progress (idle keep-alive, or request headers still arriving:
# slowloris) is closed after this long.
DEFAULT_IDLE_TIMEOUT_S = 60.0
# A request body must arrive within this long of its headers (a Content-Length lie gets 408).
DEFAULT_BODY_TIMEOUT_S = 30.0
# Open HTTP connections at most; one more is answered 503 and closed.
DEFAULT_MAX_CONNECTIONS = 4096
# SIGTERM: how long in-flight requests may take to finish before they are cut.
DEFAULT_SHUTDOWN_GRACE_S = 5.0
#: The most times a request may migrate (the launcher's --migration-limit bound too).
MAX_MIGRATION_LIMIT = 1000
#: Bounds of the sizes (a mistyped huge value is refused by name).
MAX_BODY_BYTES = 1 << 40
MAX_CONNECTIONS = 1_000_000

_SOCKETS = SocketSettings()


def listen_address(value: str) -> str:
    try:
        split_address(value, allow_port_zero=True)
    except ValueError:
        raise ValueError(f"{value!r}: expected HOST:PORT, e.g. 127.0.0.1:8000") from None
    return value


def parse_expect(values: tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for value in values:
        role, sep, count = value.partition("=")
        if not sep or role not in ROLES or not count.isdigit():
            raise ValueError(f"{value!r}: expected ROLE=N with ROLE one of {', '.join(ROLES)}, "
                             "e.g. aggregated=1")
        out[role] = int(count)
    return out


def format_expect(expect: dict[str, int]) -> list[str]:
    return [f"{role}={count}" for role, count in expect.items()]


def existing_path(value: str) -> str:
    if not Path(value).exists():
        raise ValueError(f"Path {value!r} does not exist.")
    return value


class FrontendSettings(Settings):
    """The `lab frontend` command line."""

    listen: str = setting(
        "127.0.0.1:0", "HTTP address to bind (port 0: any free port; the ready line names it).",
        parse=listen_address)
    discovery: str = setting(
        None, "Worker registry to follow: file:DIR (the directory the sidecars register in) or "
        "etcd://HOST:PORT[/prefix].", required=True)
    discovery_ttl: float = setting(
        DiscoveryTiming.ttl_s, "Seconds after which a worker record that was not refreshed "
        "counts as expired.", gt=0, le=MAX_SECONDS)
    router: str = setting(
        DEFAULT_ROUTER, "How a worker is chosen: round-robin, least-loaded (published engine "
        "load + local in-flight), or random.", choices=ROUTERS)
    client_nodelay: bool = setting(
        _SOCKETS.client_nodelay, "TCP_NODELAY on the request-plane client sockets.", on_off=True)
    split_writes: bool = setting(
        _SOCKETS.split_writes, "Send each request-plane REQUEST frame as two writes (header, then "
        "body) instead of one coalesced write.", negation="--coalesced-writes")
    pool_size: int = setting(
        _SOCKETS.pool_size, "Persistent request-plane connections per worker.", ge=1,
        le=MAX_POOL_SIZE)
    http_nodelay: bool = setting(
        _SOCKETS.http_nodelay, "TCP_NODELAY on accepted HTTP client connections.", on_off=True)
    enforce_disagg: bool = setting(
        False, "Fail requests with 503 when no prefill worker is registered instead of serving "
        "them aggregated.", default_text="off")
    migration_limit: int = setting(
        DEFAULT_MIGRATION_LIMIT, "How many times a request whose worker failed mid-stream (a "
        "retryable error, a broken stream, a stalled engine) moves to another worker, continuing "
        "from the tokens already sent; 0 = the failure reaches the client.", ge=0,
        le=MAX_MIGRATION_LIMIT)
    expect: dict[str, int] = setting(
        {}, "/health is 200 only when at least N workers of ROLE are registered (repeatable). "
        "Default: at least one worker of any role.", multiple=True, metavar="ROLE=N",
        parse=parse_expect, format=format_expect)
    tokenizer: str | None = setting(
        None, "A HuggingFace tokenizer.json (or a local model directory holding one; no hub "
        "access): prompts are encoded and output decoded with it (without its special tokens "
        "unless --add-special-tokens). "
        "Default: the word tokenizer (one token per whitespace-separated word).",
        parse=existing_path, metavar="PATH")
    add_special_tokens: bool = setting(
        False, "Encode a prompt's text with --tokenizer's special tokens (its post-processor's "
        "BOS), as vLLM's /v1/completions does: a server that adds them counts and computes one "
        "more prompt token. Off: the prompt's own tokens, as Dynamo's frontend counts them. "
        "No effect with the word tokenizer (it has none). `lab fidelity` turns it on for the "
        "lab's frontends when the target counts the probe's prompt that way.",
        default_text="off")
    reasoning_parser: str = setting(
        "", "Split a chat answer at the think-end token (</think>): tokens before it stream as "
        "delta.reasoning_content, after it as delta.content, as vLLM's --reasoning-parser does "
        "(docs/mocker.md \"Reasoning spans\"). The launcher sets it when the engine args give a "
        "reasoning span. Default: none (every token is content).",
        choices=("", *REASONING_PARSERS), default_text="none")
    model_name: str = setting(
        DEFAULT_MODEL, "Model name served (requests for other names get 404 unless a worker "
        "registered that model).")
    max_body_bytes: int = setting(
        DEFAULT_MAX_BODY_BYTES, "Largest request body accepted; larger ones get 413.", ge=1,
        le=MAX_BODY_BYTES)
    idle_timeout: float = setting(
        DEFAULT_IDLE_TIMEOUT_S, "Seconds a connection may stay open with no request in progress "
        "(idle keep-alive, or request headers still arriving) before it is closed.", ge=0.1,
        le=MAX_SECONDS)
    body_timeout: float = setting(
        DEFAULT_BODY_TIMEOUT_S, "Seconds a request body may take to arrive after its headers; "
        "then 408 and the connection closes.", ge=0.1, le=MAX_SECONDS)
    max_connections: int = setting(
        DEFAULT_MAX_CONNECTIONS, "Open HTTP connections at most; one more gets 503 and is "
        "closed.", ge=1, le=MAX_CONNECTIONS)
    shutdown_grace: float = setting(
        DEFAULT_SHUTDOWN_GRACE_S, "Seconds in-flight requests may take to finish after SIGTERM.",
        ge=0, le=MAX_SECONDS)
    debug_endpoints: bool = setting(
        False, "Serve GET /debug/conn (the asking connection's TCP_NODELAY and peer, for the "
        "socket tests and Nagle experiments). Off: it is 404, like any unknown path, so that "
        "whoever reaches the port learns nothing of its sockets.", default_text="off")
    log_level: str = setting(
        DEFAULT_LOG_LEVEL, "Log level (info logs one line per finished request).",
        choices=LOG_LEVELS, case_sensitive=False)

    @property
    def sockets(self) -> SocketSettings:
        """The socket options these settings give the frontend's connections."""
        return SocketSettings(
            client_nodelay=self.client_nodelay,
            split_writes=self.split_writes,
            pool_size=self.pool_size,
            http_nodelay=self.http_nodelay,
        )
