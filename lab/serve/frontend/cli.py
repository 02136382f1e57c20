"""`lab frontend`: the OpenAI-compatible HTTP frontend."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

import click

from lab.serve.frontend.config import (
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_SHUTDOWN_GRACE_S,
    FrontendConfig,
)
from lab.shared.settings import (
    DEFAULT_MIGRATION_LIMIT,
    DEFAULT_MODEL,
    DEFAULT_ROUTER,
    ROLES,
    ROUTERS,
    DiscoveryTiming,
    SocketSettings,
)
from lab.shared.switches import ON_OFF, is_on, on_off
from lab.wire.address import split_address
from lab.wire.ready import format_ready

_DEFAULT_SOCKETS = SocketSettings()
def _listen(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, int]:
    try:
        return split_address(value, allow_port_zero=True)
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected HOST:PORT, e.g. 127.0.0.1:8000") from None


def _expect(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for value in values:
        role, sep, count = value.partition("=")
        if not sep or role not in ROLES or not count.isdigit():
            raise click.BadParameter(
                f"{value!r}: expected ROLE=N with ROLE one of {', '.join(ROLES)}, e.g. aggregated=1"
            )
        out[role] = int(count)
    return out


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--listen",
    default="127.0.0.1:0",
    show_default=True,
    callback=_listen,
    help="HTTP address to bind (port 0: any free port; the ready line names it).",
)
@click.option(
    "--discovery",
    required=True,
    help="Worker registry to follow: file:DIR (the directory the sidecars register in) "
    "or etcd://HOST:PORT[/prefix].",
)
@click.option(
    "--discovery-ttl",
    type=click.FloatRange(min=0, min_open=True),
    default=DiscoveryTiming.ttl_s,
    show_default=True,
    help="Seconds after which a worker record that was not refreshed counts as expired.",
)
@click.option(
    "--router",
    type=click.Choice(ROUTERS),
    default=DEFAULT_ROUTER,
    show_default=True,
    help="How a worker is chosen: round-robin, least-loaded (published engine load + "
    "local in-flight), or random.",
)
@click.option(
    "--client-nodelay",
    type=ON_OFF,
    default=on_off(_DEFAULT_SOCKETS.client_nodelay),
    show_default=True,
    help="TCP_NODELAY on the request-plane client sockets.",
)
@click.option(
    "--split-writes/--coalesced-writes",
    default=_DEFAULT_SOCKETS.split_writes,
    show_default=True,
    help="Send each request-plane REQUEST frame as two writes (header, then body) "
    "instead of one coalesced write.",
)
@click.option(
    "--pool-size",
    type=click.IntRange(min=1),
    default=_DEFAULT_SOCKETS.pool_size,
    show_default=True,
    help="Persistent request-plane connections per worker.",
)
@click.option(
    "--http-nodelay",
    type=ON_OFF,
    default=on_off(_DEFAULT_SOCKETS.http_nodelay),
    show_default=True,
    help="TCP_NODELAY on accepted HTTP client connections.",
)
@click.option(
    "--enforce-disagg",
    is_flag=True,
    default=False,
    help="Fail requests with 503 when no prefill worker is registered instead of "
    "serving them aggregated.  [default: off]",
)
@click.option(
    "--migration-limit",
    type=click.IntRange(min=0),
    default=DEFAULT_MIGRATION_LIMIT,
    show_default=True,
    help="How many times a request whose worker failed mid-stream (a retryable error, a "
    "broken stream, a stalled engine) moves to another worker, continuing from the tokens "
    "already sent; 0 = the failure reaches the client.",
)
@click.option(
    "--expect",
    "expect",
    multiple=True,
    callback=_expect,
    metavar="ROLE=N",
    help="/health is 200 only when at least N workers of ROLE are registered "
    "(repeatable). Default: at least one worker of any role.",
)
@click.option(
    "--tokenizer",
    "tokenizer_path",
    default=None,
    type=click.Path(exists=True, path_type=str),
    help="A HuggingFace tokenizer.json (or a local model directory holding one; no hub "
    "access): prompts are encoded and output decoded with it (add_special_tokens=False). "
    "Default: the word tokenizer (one token per whitespace-separated word).",
)
@click.option(
    "--model-name",
    default=DEFAULT_MODEL,
    show_default=True,
    help="Model name served (requests for other names get 404 unless a worker "
    "registered that model).",
)
@click.option(
    "--max-body-bytes",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_BODY_BYTES,
    show_default=True,
    help="Largest request body accepted; larger ones get 413.",
)
@click.option(
    "--idle-timeout",
    type=click.FloatRange(min=0.1),
    default=DEFAULT_IDLE_TIMEOUT_S,
    show_default=True,
    help="Seconds a connection may stay open with no request in progress (idle keep-alive, "
    "or request headers still arriving) before it is closed.",
)
@click.option(
    "--body-timeout",
    type=click.FloatRange(min=0.1),
    default=DEFAULT_BODY_TIMEOUT_S,
    show_default=True,
    help="Seconds a request body may take to arrive after its headers; then 408 and the "
    "connection closes.",
)
@click.option(
    "--max-connections",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_CONNECTIONS,
    show_default=True,
    help="Open HTTP connections at most; one more gets 503 and is closed.",
)
@click.option(
    "--shutdown-grace",
    type=click.FloatRange(min=0),
    default=DEFAULT_SHUTDOWN_GRACE_S,
    show_default=True,
    help="Seconds in-flight requests may take to finish after SIGTERM.",
)
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]),
    default="INFO",
    show_default=True,
    help="Log level (INFO logs one line per finished request).",
)
def frontend(
    listen: tuple[str, int],
    discovery: str,
    discovery_ttl: float,
    router: str,
    client_nodelay: str,
    split_writes: bool,
    pool_size: int,
    http_nodelay: str,
    enforce_disagg: bool,
    migration_limit: int,
    expect: dict[str, int],
    tokenizer_path: str | None,
    model_name: str,
    max_body_bytes: int,
    idle_timeout: float,
    body_timeout: float,
    max_connections: int,
    shutdown_grace: float,
    log_level: str,
) -> None:
    """Run the OpenAI-compatible frontend: /v1/completions, /v1/chat/completions, /v1/models,
    /health, /live, /metrics. Workers are found in discovery; requests go to them over the
    request plane (prefill -> decode when prefill workers are registered).
    """
    from lab.serve.discovery import open_registry
    from lab.serve.tokenizer import load_tokenizer

    try:
        registry = open_registry(discovery, ttl_s=discovery_ttl)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--discovery") from None
    try:
        tokenizer = load_tokenizer(tokenizer_path)
    except (RuntimeError, ValueError, OSError) as exc:
        raise click.BadParameter(str(exc), param_hint="--tokenizer") from None

    config = FrontendConfig(
        listen_host=listen[0],
        listen_port=listen[1],
        discovery=discovery,
        router=router,
        sockets=SocketSettings(
            client_nodelay=is_on(client_nodelay),
            split_writes=split_writes,
            pool_size=pool_size,
            http_nodelay=is_on(http_nodelay),
        ),
        enforce_disagg=enforce_disagg,
        migration_limit=migration_limit,
        expect=expect,
        tokenizer=tokenizer_path,
        model_name=model_name,
        max_body_bytes=max_body_bytes,
        shutdown_grace_s=shutdown_grace,
        idle_timeout_s=idle_timeout,
        body_timeout_s=body_timeout,
        max_connections=max_connections,
    )
    logging.basicConfig(
        stream=sys.stderr,
        level=getattr(logging, log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    import uvloop

    try:
        uvloop.run(_main(config, registry, tokenizer))
    except OSError as exc:  # e.g. the address is in use
        logging.getLogger("lab.frontend").error("cannot serve on %s:%d: %s", *listen, exc)
        sys.exit(1)


async def _main(config: FrontendConfig, registry: object, tokenizer: object) -> None:
    from lab.serve.frontend.server import FrontendServer

    log = logging.getLogger("lab.frontend")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = FrontendServer(config, registry=registry, tokenizer=tokenizer)  # type: ignore[arg-type]
    await server.serve(
        stop, lambda addr: log.info(format_ready("frontend", config.frontend_id, addr))
    )
    log.info("frontend stopped")
