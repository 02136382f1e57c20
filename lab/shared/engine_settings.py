"""`mocker serve`'s settings, defined once: its CLI and the launcher's engine argv come from here.

The engine's own simulation settings (scheduler, KV pool, timing) are `mocker.engine.EngineArgs`,
passed as `--engine-args` JSON; the server runs on these settings and the engine args they name
(`mocker.server.config.ServerConfig`).
"""

from __future__ import annotations

from pydantic import model_validator

from lab.shared.config_cli import MAX_SECONDS, MAX_SEED, Settings, setting
from lab.shared.settings import DEFAULT_LOG_LEVEL, LOG_LEVELS
from lab.wire.address import split_address
from lab.wire.constants import DEFAULT_MODEL, DEFAULT_STREAM_INTERVAL, MAX_STREAM_INTERVAL, ROLES

DEFAULT_LISTEN = "127.0.0.1:50051"
DEFAULT_ROLE = "aggregated"
DEFAULT_SEED = 42
DEFAULT_CONTEXT_LENGTH = 32768
DEFAULT_MAX_CONCURRENT_REQUESTS = 256
#: Bounds of the sizes (a mistyped huge value is refused by name): 16 M tokens of vocabulary
#: or context is beyond any model served here.
MAX_VOCAB_SIZE = 1 << 24
MAX_CONTEXT_LENGTH = 1 << 24
MAX_CONCURRENT_REQUESTS = 1_000_000
DEFAULT_KV_HOST = "127.0.0.1"
DEFAULT_KV_PORT = 5600
#: Consumer-stall watchdog (the real servicer's RESPONSE_STALL_TIMEOUT_SECONDS).
STALL_TIMEOUT_S = 30.0
#: Graceful-stop grace for in-flight requests.
GRACE_S = 5.0
#: Run-ahead window: at most this many passes whose simulated end has already passed are run
#: and handed out together, so a stream may hold this many untaken tokens (docs/token-path.md).
DEFAULT_RUN_AHEAD = 4
MAX_RUN_AHEAD = 64
#: EngineArgs' speedup defaults, shown in --help (mocker.engine.config holds the values;
#: tests/mocker/test_cli.py checks they agree).
ENGINE_SPEEDUP_DEFAULT_TEXT = "1"


def listen_address(value: str) -> str:
    """HOST:PORT with PORT 0-65535 (0 = any free port); ValueError otherwise."""
    try:
        split_address(value, allow_port_zero=True)
    except ValueError:
        raise ValueError(
            f"expected HOST:PORT (PORT 0-65535; 0 = any free port), got {value!r}"
        ) from None
    return value


def non_empty(value: str) -> str:
    if not value:
        raise ValueError("must be non-empty")
    return value


class EngineSettings(Settings):
    """The `mocker serve` command line."""

    listen: str = setting(
        DEFAULT_LISTEN, "HOST:PORT to serve gRPC on; port 0 picks a free port (the ready line "
        "names it).", parse=listen_address)
    admin_listen: str | None = setting(
        None, "Serve the fault-injection service (loadlab.mocker.v1.Admin: SetHealth, "
        "StallTokens, Freeze, Exit, ExecutorFailure) on its own HOST:PORT (port 0 picks one; the "
        "ready line names it as admin=).", parse=listen_address, metavar="HOST:PORT",
        default_text="not served")
    role: str = setting(
        DEFAULT_ROLE, "aggregated serves whole requests; prefill serves context_only requests "
        "and hands off a KV session; decode serves requests carrying a kv.session (and bypassed "
        "prefills).", choices=ROLES, aliases=("--disaggregation-mode",))
    model: str = setting(
        DEFAULT_MODEL, "Model identity reported by GetServerInfo/GetModelInfo (any non-empty "
        "request model name is served).", parse=non_empty)
    seed: int = setting(
        DEFAULT_SEED, "Seed of the deterministic token ids and session UUIDs.", ge=0,
        le=MAX_SEED)
    tokenizer: str | None = setting(
        None, "The model's HuggingFace tokenizer.json (or a local model directory holding one): "
        "output token ids are its vocabulary without its special tokens (BOS, EOS, pad, ...) and "
        "without ids that decode alone to a piece of a UTF-8 character "
        "(docs/mocker.md \"Tokens\").", metavar="PATH",
        default_text="ids in [1000, 31999], the lab frontend's default word tokenizer")
    vocab_size: int | None = setting(
        None, "Without --tokenizer: output token ids are 0 .. N-1.", ge=1, le=MAX_VOCAB_SIZE,
        metavar="N",
        default_text="ids in [1000, 31999]")
    context_length: int = setting(
        DEFAULT_CONTEXT_LENGTH, "Context window (ModelInfo.max_context_length); outputs are "
        "clamped to it, prompts that fill it are rejected. Must be > 0.", gt=0,
        le=MAX_CONTEXT_LENGTH)
    max_concurrent_requests: int = setting(
        DEFAULT_MAX_CONCURRENT_REQUESTS, "Generate streams served at once; one more is refused "
        "with RESOURCE_EXHAUSTED.", gt=0, le=MAX_CONCURRENT_REQUESTS)
    speedup_ratio: float | None = setting(
        None, "Divide every modeled time by this; 0 = never sleep (instant engine). Overrides "
        "the engine args.", ge=0, default_text=ENGINE_SPEEDUP_DEFAULT_TEXT)
    decode_speedup_ratio: float | None = setting(
        None, "Extra divisor for decode steps (effective: speedup x this). Overrides the engine "
        "args.", ge=0, default_text=ENGINE_SPEEDUP_DEFAULT_TEXT)
    engine_args: str | None = setting(
        None, "Engine args (mocker.engine.EngineArgs) as inline JSON (starting with '{') or a "
        "JSON file: engine_type (trtllm|vllm), num_gpu_blocks, block_size, max_num_seqs, "
        "max_num_batched_tokens, enable_prefix_caching, enable_chunked_prefill, speedup_ratio, "
        "decode_speedup_ratio, kv_transfer_bandwidth, kv_bytes_per_token, timing, "
        "first_token_decode. Unknown keys "
        "are rejected.", aliases=("--extra-engine-args",), metavar="JSON|FILE",
        default_text="the reference TRT-LLM defaults")
    kv_host: str = setting(
        DEFAULT_KV_HOST, "KV endpoint host published in the handoff and in GetServerInfo.",
        parse=non_empty)
    kv_port: int = setting(
        DEFAULT_KV_PORT, "KV endpoint port published in the handoff (must be non-zero for "
        "prefill/decode).", ge=0, le=65535)
    instance_id: str | None = setting(
        None, "Instance id reported by GetServerInfo/GetLoad and the ready line.",
        default_text="dynamo-trtllm-mocker-<role>")
    record_requests: bool = setting(
        False, "Keep the last 256 accepted Generate requests, readable over gRPC at "
        "/loadlab.mocker.v1.Recorder/List (mocker.server.recorder.list_recorded).",
        negation="--no-record-requests")
    stall_timeout: float = setting(
        STALL_TIMEOUT_S, "Seconds a client may leave the response stream undrained before the "
        "request is aborted with an OVERLOADED (retryable) error.", gt=0,
        le=MAX_SECONDS)
    stream_interval: int = setting(
        DEFAULT_STREAM_INTERVAL, "Tokens per TokenOutput message: 1 = every engine step is its "
        "own message; N = every N tokens plus the last ones (like vLLM --stream-interval, "
        "TensorRT-LLM stream_interval).", ge=1, le=MAX_STREAM_INTERVAL, metavar="N")
    run_ahead: int = setting(
        DEFAULT_RUN_AHEAD, "Run-ahead window K: when the engine is behind its schedule (speedup "
        "1000 or 0), up to K passes that are already due run back to back and each stream "
        "gets their K tokens at once (each still its own TokenOutput), so the writes downstream "
        "can carry several events; a stream holds at most K untaken tokens before the engine "
        "waits for it. 1 = lock-step (one pass, then wait for every stream). On schedule "
        "(speedup 1) passes are spaced by their simulated time and this changes nothing.",
        ge=1, le=MAX_RUN_AHEAD, metavar="K")
    grace: float = setting(
        GRACE_S, "Seconds in-flight requests get to finish on SIGTERM/SIGINT.", ge=0,
        le=MAX_SECONDS)
    log_level: str = setting(
        DEFAULT_LOG_LEVEL, "Log level (logs go to stderr).", choices=LOG_LEVELS,
        case_sensitive=False)

    @model_validator(mode="after")
    def _kv_port_for_handoff(self) -> EngineSettings:
        if self.role != "aggregated" and self.kv_port == 0:
            raise ValueError(f"--kv-port must be non-zero for the {self.role} role (it is "
                             "published in the handoff)")
        return self
