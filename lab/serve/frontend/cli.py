"""`lab frontend`: the OpenAI-compatible HTTP frontend."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

import click

from lab.serve.frontend.config import FRONTEND_ID
from lab.shared.config_cli import options
from lab.shared.frontend_settings import FrontendSettings
from lab.wire.ready import format_ready


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@options(FrontendSettings)
def frontend(settings: FrontendSettings) -> None:
    """Run the OpenAI-compatible frontend: /v1/completions, /v1/chat/completions, /v1/models,
    /health, /live, /metrics. Workers are found in discovery; requests go to them over the
    request plane (prefill -> decode when prefill workers are registered).
    """
    s = settings
    from lab.serve.discovery import open_registry
    from lab.serve.tokenizer import load_tokenizer

    try:
        registry = open_registry(s.discovery, ttl_s=s.discovery_ttl)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--discovery") from None
    try:
        tokenizer = load_tokenizer(s.tokenizer, special_tokens=s.add_special_tokens)
    except (RuntimeError, ValueError, OSError) as exc:
        raise click.BadParameter(str(exc), param_hint="--tokenizer") from None
    if s.reasoning_parser:
        from lab.shared.reasoning import think_end_id

        try:
            think_end_id(s.tokenizer)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--reasoning-parser") from None

    logging.basicConfig(
        stream=sys.stderr,
        level=getattr(logging, s.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    import uvloop

    try:
        uvloop.run(_main(s, registry, tokenizer))
    except OSError as exc:  # e.g. the address is in use
        logging.getLogger("lab.frontend").error("cannot serve on %s: %s", s.listen, exc)
        sys.exit(1)


async def _main(settings: FrontendSettings, registry: object, tokenizer: object) -> None:
    from lab.serve.frontend.server import FrontendServer

    log = logging.getLogger("lab.frontend")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = FrontendServer(settings, registry=registry, tokenizer=tokenizer)  # type: ignore[arg-type]
    await server.serve(
        stop, lambda addr: log.info(format_ready("frontend", FRONTEND_ID, addr))
    )
    log.info("frontend stopped")
