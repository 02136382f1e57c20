"""The `mocker` command: `mocker serve` (the openengine.v1 engine) and `mocker bench`."""

from __future__ import annotations

import logging
import sys

import click

from lab.shared.config_cli import MAX_SECONDS, FiniteFloatRange, options
from lab.shared.engine_settings import (
    MAX_CONCURRENT_REQUESTS,
    MAX_CONTEXT_LENGTH,
    EngineSettings,
)
from mocker.server import config as sc


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        stream=sys.stderr,
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


def _run(coro) -> int:
    import asyncio

    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """A CPU mock of an LLM engine that speaks openengine.v1 over gRPC."""


@main.command()
@options(EngineSettings)
def serve(settings: EngineSettings) -> None:
    """Serve openengine.v1 Inference + Control and grpc.health.v1 (and, with --admin-listen,
    the fault-injection service on its own address)."""
    s = settings
    try:
        cfg = sc.ServerConfig.from_settings(s)  # a bad file fails here, in one line
    except sc.SettingError as exc:
        raise click.BadParameter(str(exc), param_hint=f"'{exc.option}'") from None
    _setup_logging(s.log_level)
    from mocker.server.app import serve as serve_async

    sys.exit(_run(serve_async(cfg)))


@main.command()
@click.option(
    "--drift-seconds", type=FiniteFloatRange(min=0, min_open=True, max=MAX_SECONDS),
    default=10.0, show_default=True,
    help="Length of the simulated-vs-wall drift run (speedup 1, 256 running sequences).",
)
@click.option(
    "--concurrency", type=click.IntRange(1, MAX_CONCURRENT_REQUESTS), default=32, show_default=True,
    help="Concurrent gRPC streams of the streaming benchmark (speedup 0).",
)
@click.option(
    "--tokens", type=click.IntRange(1, MAX_CONTEXT_LENGTH), default=128, show_default=True,
    help="Output tokens per request of the streaming benchmark.",
)
@click.option(
    "--stream-seconds", type=FiniteFloatRange(min=0, min_open=True, max=MAX_SECONDS),
    default=10.0,
    show_default=True,
    help="Length of the streaming benchmark.",
)
@click.option(
    "--only", type=click.Choice(["pass", "drift", "stream"]), multiple=True,
    help="Run only these parts (repeatable). [default: all]",
)
def bench(
    drift_seconds: float,
    concurrency: int,
    tokens: int,
    stream_seconds: float,
    only: tuple[str, ...],
) -> None:
    """Print pass cost, simulated-time drift and gRPC streaming throughput on this machine."""
    from mocker.bench import run_bench

    _setup_logging("warning")
    run_bench(
        drift_seconds=drift_seconds,
        concurrency=concurrency,
        tokens=tokens,
        stream_seconds=stream_seconds,
        parts=set(only) or {"pass", "drift", "stream"},
    )


if __name__ == "__main__":  # pragma: no cover
    main()
