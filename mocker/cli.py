"""The `mocker` command: `mocker serve` (the openengine.v1 engine) and `mocker bench`."""

from __future__ import annotations

import logging
import sys

import click

from lab.wire.address import split_address
from lab.wire.constants import DEFAULT_STREAM_INTERVAL, MAX_STREAM_INTERVAL
from mocker.engine import EngineArgs
from mocker.server import config as sc
from mocker.server.vocab import allowed_ids

_ENGINE_DEFAULTS = EngineArgs()


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


def _check_listen(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        split_address(value, allow_port_zero=True)
    except ValueError:
        raise click.BadParameter(
            f"expected HOST:PORT (PORT 0-65535; 0 = any free port), got {value!r}"
        ) from None
    return value


def _check_listen_opt(ctx: click.Context, param: click.Parameter, value: str | None):
    return None if value is None else _check_listen(ctx, param, value)


def _positive(ctx: click.Context, param: click.Parameter, value):
    if value is not None and value <= 0:
        raise click.BadParameter(f"must be > 0, got {value}")
    return value


def _non_negative(ctx: click.Context, param: click.Parameter, value):
    if value is not None and not value >= 0:
        raise click.BadParameter(f"must be >= 0, got {value}")
    return value


def _non_empty(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not value:
        raise click.BadParameter("must be non-empty")
    return value


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """A CPU mock of an LLM engine that speaks openengine.v1 over gRPC."""


@main.command()
@click.option(
    "--listen", default=sc.DEFAULT_LISTEN, show_default=True, callback=_check_listen,
    help="HOST:PORT to serve gRPC on; port 0 picks a free port (the ready line names it).",
)
@click.option(
    "--admin-listen", default=None, callback=_check_listen_opt, metavar="HOST:PORT",
    help="Serve the fault-injection service (loadlab.mocker.v1.Admin: SetHealth, StallTokens, "
    "Freeze, Exit, ExecutorFailure) on its own HOST:PORT (port 0 picks one; the ready line "
    "names it as admin=). [default: not served]",
)
@click.option(
    "--role", "--disaggregation-mode", "role", type=click.Choice(sc.ROLES),
    default=sc.DEFAULT_ROLE, show_default=True,
    help="aggregated serves whole requests; prefill serves context_only requests and hands "
    "off a KV session; decode serves requests carrying a kv.session (and bypassed prefills).",
)
@click.option(
    "--model", default=sc.DEFAULT_MODEL, show_default=True, callback=_non_empty,
    help="Model identity reported by GetServerInfo/GetModelInfo (any non-empty request model "
    "name is served).",
)
@click.option(
    "--seed", type=click.IntRange(min=0), default=sc.DEFAULT_SEED, show_default=True,
    help="Seed of the deterministic token ids and session UUIDs.",
)
@click.option(
    "--tokenizer", default="", metavar="PATH",
    help="The model's HuggingFace tokenizer.json (or a local model directory holding one): "
    "output token ids are its vocabulary without its special tokens (BOS, EOS, pad, ...) and "
    "without ids that decode alone to a piece of a UTF-8 character (docs/mocker.md \"Tokens\"). "
    "[default: ids in [1000, 31999], the lab frontend's default word tokenizer]",
)
@click.option(
    "--vocab-size", type=click.IntRange(min=1), default=None, metavar="N",
    help="Without --tokenizer: output token ids are 0 .. N-1. [default: ids in [1000, 31999]]",
)
@click.option(
    "--context-length", type=int, default=sc.DEFAULT_CONTEXT_LENGTH, show_default=True,
    callback=_positive,
    help="Context window (ModelInfo.max_context_length); outputs are clamped to it, prompts "
    "that fill it are rejected. Must be > 0.",
)
@click.option(
    "--max-concurrent-requests", type=int, default=sc.DEFAULT_MAX_CONCURRENT_REQUESTS,
    show_default=True, callback=_positive,
    help="Generate streams served at once; one more is refused with RESOURCE_EXHAUSTED.",
)
@click.option(
    "--speedup-ratio", type=float, default=None, callback=_non_negative,
    help=f"Divide every modeled time by this; 0 = never sleep (instant engine). Overrides "
    f"the engine args. [default: {_ENGINE_DEFAULTS.speedup_ratio:g}]",
)
@click.option(
    "--decode-speedup-ratio", type=float, default=None, callback=_non_negative,
    help=f"Extra divisor for decode steps (effective: speedup x this). Overrides the engine "
    f"args. [default: {_ENGINE_DEFAULTS.decode_speedup_ratio:g}]",
)
@click.option(
    "--engine-args", "--extra-engine-args", "engine_args", default=None, metavar="JSON|FILE",
    help="Engine args (mocker.engine.EngineArgs) as inline JSON (starting with '{') or a JSON "
    "file: engine_type (trtllm|vllm), num_gpu_blocks, block_size, max_num_seqs, "
    "max_num_batched_tokens, enable_prefix_caching, enable_chunked_prefill, speedup_ratio, "
    "decode_speedup_ratio, kv_transfer_bandwidth, kv_bytes_per_token, timing. Unknown keys "
    "are rejected. [default: the reference TRT-LLM defaults]",
)
@click.option(
    "--kv-host", default=sc.DEFAULT_KV_HOST, show_default=True, callback=_non_empty,
    help="KV endpoint host published in the handoff and in GetServerInfo.",
)
@click.option(
    "--kv-port", type=click.IntRange(0, 65535), default=sc.DEFAULT_KV_PORT, show_default=True,
    help="KV endpoint port published in the handoff (must be non-zero for prefill/decode).",
)
@click.option(
    "--instance-id", default=None,
    help="Instance id reported by GetServerInfo/GetLoad and the ready line. "
    "[default: dynamo-trtllm-mocker-<role>]",
)
@click.option(
    "--record-requests/--no-record-requests", default=False, show_default=True,
    help="Keep the last 256 accepted Generate requests, readable over gRPC at "
    "/loadlab.mocker.v1.Recorder/List (mocker.server.recorder.list_recorded).",
)
@click.option(
    "--stall-timeout", type=float, default=sc.STALL_TIMEOUT_S, show_default=True,
    callback=_positive,
    help="Seconds a client may leave the response stream undrained before the request is "
    "aborted with an OVERLOADED (retryable) error.",
)
@click.option(
    "--stream-interval", type=click.IntRange(1, MAX_STREAM_INTERVAL),
    default=DEFAULT_STREAM_INTERVAL,
    show_default=True,
    help="Tokens per TokenOutput message: 1 = every engine step is its own message; N = every "
    "N tokens plus the last ones (like vLLM --stream-interval, TensorRT-LLM stream_interval).",
)
@click.option(
    "--grpc-server", type=click.Choice(sc.GRPC_SERVERS), default=sc.DEFAULT_GRPC_SERVER,
    show_default=True,
    help="gRPC server implementation: h2 (batched HTTP/2: one socket write per event-loop turn "
    "for all streams) or aio (grpc.aio, the reference). Both speak the same wire protocol.",
)
@click.option(
    "--grace", type=float, default=sc.GRACE_S, show_default=True, callback=_non_negative,
    help="Seconds in-flight requests get to finish on SIGTERM/SIGINT.",
)
@click.option(
    "--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
    show_default=True, help="Log level (logs go to stderr).",
)
def serve(
    listen: str,
    admin_listen: str | None,
    role: str,
    model: str,
    seed: int,
    tokenizer: str,
    vocab_size: int | None,
    context_length: int,
    max_concurrent_requests: int,
    speedup_ratio: float | None,
    decode_speedup_ratio: float | None,
    engine_args: str | None,
    kv_host: str,
    kv_port: int,
    instance_id: str | None,
    record_requests: bool,
    stall_timeout: float,
    stream_interval: int,
    grpc_server: str,
    grace: float,
    log_level: str,
) -> None:
    """Serve openengine.v1 Inference + Control and grpc.health.v1 (and, with --admin-listen,
    the fault-injection service on its own address)."""
    try:
        args = sc.load_engine_args(
            engine_args, speedup_ratio=speedup_ratio, decode_speedup_ratio=decode_speedup_ratio
        )
    except (ValueError, TypeError) as exc:
        raise click.BadParameter(str(exc), param_hint="'--engine-args'") from None
    if role != "aggregated" and kv_port == 0:
        raise click.BadParameter(
            f"must be non-zero for the {role} role (it is published in the handoff)",
            param_hint="'--kv-port'",
        )
    try:
        allowed_ids(tokenizer, vocab_size or 0)  # a bad file fails here, in one line
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--tokenizer'") from None
    cfg = sc.ServerConfig(
        role=role,
        model=model,
        seed=seed,
        tokenizer=tokenizer,
        vocab_size=vocab_size or 0,
        context_length=context_length,
        max_concurrent_requests=max_concurrent_requests,
        kv_host=kv_host,
        kv_port=kv_port,
        instance_id=instance_id or "",
        record_requests=record_requests,
        stall_timeout_s=stall_timeout,
        grace_s=grace,
        stream_interval=stream_interval,
        grpc_server=grpc_server,
        engine=args,
    )
    _setup_logging(log_level)
    from mocker.server.app import serve as serve_async

    sys.exit(_run(serve_async(cfg, listen, admin_listen)))


@main.command()
@click.option(
    "--drift-seconds", type=float, default=10.0, show_default=True, callback=_positive,
    help="Length of the simulated-vs-wall drift run (speedup 1, 256 running sequences).",
)
@click.option(
    "--concurrency", type=int, default=32, show_default=True, callback=_positive,
    help="Concurrent gRPC streams of the streaming benchmark (speedup 0).",
)
@click.option(
    "--tokens", type=int, default=128, show_default=True, callback=_positive,
    help="Output tokens per request of the streaming benchmark.",
)
@click.option(
    "--stream-seconds", type=float, default=10.0, show_default=True, callback=_positive,
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
