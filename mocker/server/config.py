"""Server-level settings of `mocker serve` (command-line defaults: lab.shared.engine_settings).

Engine (scheduler, KV pool, timing) defaults live in `mocker.engine.config.EngineArgs`; these are
the wire server's own (docs/mocker.md "Defaults").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lab.shared.engine_settings import (
    DEFAULT_CONTEXT_LENGTH,
    DEFAULT_KV_HOST,
    DEFAULT_KV_PORT,
    DEFAULT_MAX_CONCURRENT_REQUESTS,
    DEFAULT_ROLE,
    DEFAULT_RUN_AHEAD,
    DEFAULT_SEED,
    GRACE_S,
    MAX_RUN_AHEAD,
    STALL_TIMEOUT_S,
)
from lab.shared.json_arg import read_json_object
from lab.wire.constants import (
    DEFAULT_MODEL,
    DEFAULT_STREAM_INTERVAL,
    MAX_STREAM_INTERVAL,
    ROLES,
)
from mocker.engine import EngineArgs

#: ModelInfo.max_output_tokens and the max_tokens limit (newest reference control test).
MAX_OUTPUT_TOKENS = 1_000_000
#: max_tokens when the request omits it.
DEFAULT_MAX_TOKENS = 20
#: Admin argument bounds: StallTokens seconds, Exit codes.
MAX_ADMIN_STALL_S = 3600.0
ADMIN_EXIT_CODES = range(0, 256)
#: Request recorder ring size.
RECORDER_CAPACITY = 256
ENGINE_NAME = "tensorrt_llm"
SCHEMA_REVISION = 1
MINIMUM_CLIENT_REVISION = 1
KV_SCHEMA_VERSION = 1
#: Candidate lists are capped at this many entries (ModelInfo max_top_n).
MAX_TOP_N = 20


def load_engine_args(text_or_path: str | None, **overrides: Any) -> EngineArgs:
    """Engine args from inline JSON (text starting with "{"), a JSON file path, or None/"".

    Keyword overrides (e.g. speedup_ratio from the command line) win over the JSON; None means
    not given. Every error (unreadable file, bad JSON, unknown key, bad value) is a ValueError
    naming the problem.
    """
    obj: dict[str, Any] = {}
    if text_or_path is not None and text_or_path.strip():
        obj = read_json_object(text_or_path, "engine args")
    merged = {**obj, **{k: v for k, v in overrides.items() if v is not None}}
    return EngineArgs.from_json(merged)


def default_instance_id(role: str) -> str:
    return f"dynamo-trtllm-mocker-{role}"


@dataclass(frozen=True)
class ServerConfig:
    """Everything the server needs besides the engine args."""

    #: aggregated, prefill (context-only legs, stamps a KV session) or decode (strict handoff).
    role: str = DEFAULT_ROLE
    #: The name ModelInfo reports and requests must ask for.
    model: str = DEFAULT_MODEL
    #: Seeds token ids, logprobs and session ids: one seed, one reproducible run.
    seed: int = DEFAULT_SEED
    #: ModelInfo.context_length; longer prompts are refused.
    context_length: int = DEFAULT_CONTEXT_LENGTH
    #: Generate streams admitted at once; one more is RESOURCE_EXHAUSTED.
    max_concurrent_requests: int = DEFAULT_MAX_CONCURRENT_REQUESTS
    #: The KV endpoint a prefill worker stamps into its handoff.
    kv_host: str = DEFAULT_KV_HOST
    kv_port: int = DEFAULT_KV_PORT
    #: ServerInfo.instance_id; empty = default_instance_id(role).
    instance_id: str = ""
    #: Keep the last RECORDER_CAPACITY requests for the admin service to report.
    record_requests: bool = False
    #: A stream whose consumer takes nothing for this long ends OVERLOADED (retryable).
    stall_timeout_s: float = STALL_TIMEOUT_S
    #: On SIGTERM, in-flight requests get this long to finish.
    grace_s: float = GRACE_S
    #: Tokens per TokenOutput (the last ones of a stream may be fewer).
    stream_interval: int = DEFAULT_STREAM_INTERVAL
    #: Passes already due that the engine loop runs and hands out together (engine_loop.py).
    run_ahead: int = DEFAULT_RUN_AHEAD
    #: The model's HuggingFace tokenizer (tokenizer.json or its directory): output ids are its
    #: vocabulary but its special tokens (mocker.server.vocab). Empty = not given.
    tokenizer: str = ""
    #: Without a tokenizer: output ids are 0 .. vocab_size - 1. 0 = not given; neither given =
    #: ids in [1000, 31999] (the frontend's default word tokenizer).
    vocab_size: int = 0
    #: The simulation's own settings (scheduler, KV pool, timing).
    engine: EngineArgs = field(default_factory=EngineArgs)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {self.role!r}")
        if not 1 <= self.stream_interval <= MAX_STREAM_INTERVAL:
            raise ValueError(
                f"stream_interval must be in [1, {MAX_STREAM_INTERVAL}], got {self.stream_interval}"
            )
        if not 1 <= self.run_ahead <= MAX_RUN_AHEAD:
            raise ValueError(f"run_ahead must be in [1, {MAX_RUN_AHEAD}], got {self.run_ahead}")
        if self.vocab_size < 0:
            raise ValueError(f"vocab_size must be >= 0, got {self.vocab_size}")
        if not self.instance_id:
            object.__setattr__(self, "instance_id", default_instance_id(self.role))
