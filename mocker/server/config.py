"""What `mocker serve` runs on, and the wire server's own constants.

Its settings are `lab.shared.engine_settings.EngineSettings` (command line, defaults, bounds);
engine (scheduler, KV pool, timing) defaults live in `mocker.engine.config.EngineArgs`
(docs/mocker.md "Defaults").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lab.shared.engine_settings import EngineSettings
from lab.shared.json_arg import read_json_object
from lab.shared.reasoning import think_end_id
from mocker.engine import EngineArgs

from .vocab import allowed_ids

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


class SettingError(ValueError):
    """A setting that names something unusable; `option` is its command-line flag."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


@dataclass(frozen=True)
class ServerConfig:
    """What the server runs on: `mocker serve`'s settings (`EngineSettings`, where each one is
    defined) and what three of them name, resolved once: the engine args, the instance id and
    the ids the engine emits."""

    settings: EngineSettings
    #: The simulation's own settings (scheduler, KV pool, timing), from --engine-args and the
    #: speedup options.
    engine: EngineArgs
    #: ServerInfo.instance_id: --instance-id, or default_instance_id(role).
    instance_id: str
    #: The ids the engine emits (the token deriver's table), from --tokenizer / --vocab-size.
    allowed_ids: Sequence[int]
    #: The think-end marker a reasoning span ends with (docs/mocker.md "Reasoning spans"), from
    #: the tokenizer; None when the engine args configure no span.
    think_end: int | None = None

    @classmethod
    def from_settings(cls, settings: EngineSettings) -> ServerConfig:
        """Read the engine args and the tokenizer the settings name; SettingError (naming the
        option and the problem) if either is bad."""
        try:
            engine = load_engine_args(
                settings.engine_args,
                speedup_ratio=settings.speedup_ratio,
                decode_speedup_ratio=settings.decode_speedup_ratio,
            )
        except (ValueError, TypeError) as exc:
            raise SettingError("--engine-args", str(exc)) from None
        try:
            ids = allowed_ids(settings.tokenizer or "", settings.vocab_size or 0)
        except ValueError as exc:
            raise SettingError("--tokenizer", str(exc)) from None
        think_end = None
        if engine.reasoning_tokens or engine.reasoning_share:
            if settings.vocab_size:
                raise SettingError("--vocab-size", "a reasoning span needs the default "
                                   "vocabulary or --tokenizer (its </think> token ends the span)")
            try:
                think_end = think_end_id(settings.tokenizer)
            except ValueError as exc:
                raise SettingError("--tokenizer", str(exc)) from None
            # the marker is emitted only where the span ends, never drawn
            ids = [i for i in ids if i != think_end] if think_end in ids else ids
        instance_id = settings.instance_id or default_instance_id(settings.role)
        return cls(settings, engine, instance_id, ids, think_end)
