"""Engine arguments of the simulated engine: the one place engine defaults live.

Defaults match the reference mocker's TensorRT-LLM server (docs/mocker.md
"Defaults"): block size 32, 16384 KV blocks, 256 running sequences,
8192 batched tokens per pass, prefix caching and chunked prefill on, speedup 1.0, 64 GB/s KV
transfer and 131072 KV bytes per token (32 layers x 2 x 8 KV heads x 128 head dim x 2 bytes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeGuard

ENGINE_TYPES = ("trtllm", "vllm")
DEFAULT_ENGINE_TYPE = "trtllm"
#: block size used when the JSON does not give one, per engine type (reference builder defaults)
DEFAULT_BLOCK_SIZE = {"trtllm": 32, "vllm": 64}
#: whether the pass that finishes a prompt also charges a decode step for the first token, per
#: engine type when the JSON does not say (docs/mocker.md "Scheduler"). Off for both: Dynamo
#: 1.6.1's mocker charges none under either policy (its offline replay: TTFT at c=1 = prefill
#: alone), its TensorRT-LLM mocker server runs that `trtllm` policy, and TensorRT-LLM samples
#: the first token from the context pass itself (a context-only request returns it);
#: docs/mocker.md "The first token under trtllm".
DEFAULT_FIRST_TOKEN_DECODE = {"trtllm": False, "vllm": False}
DEFAULT_NUM_GPU_BLOCKS = 16384
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
DEFAULT_KV_TRANSFER_BANDWIDTH_GBPS = 64.0
#: 32 layers x 2 (K and V) x 8 KV heads x 128 head dim x 2 bytes (bf16)
DEFAULT_KV_BYTES_PER_TOKEN = 32 * 2 * 8 * 128 * 2
TIMING_TYPES = ("polynomial", "linear", "fixed", "profile")
#: the per-pass coefficients of the ``linear`` timing model (ms; mocker/engine/timing.py), in
#: the order of `mocker.engine.timing.pass_features`
LINEAR_PASS_TERMS = ("pass_ms", "token_ms", "seq_ms", "kv_token_ms", "attention_mpair_ms",
                     "prefill_pass_ms")
#: its per-request coefficients: a latency before the request may be scheduled (no pass; with
#: REQUEST_AFTER_SHARE, part of it after the first pass instead), or with ``request_mode:
#: floor`` a first-token floor (REQUEST_MODES)
LINEAR_REQUEST_TERMS = ("request_ms", "request_token_ms")
LINEAR_TERMS = LINEAR_PASS_TERMS + LINEAR_REQUEST_TERMS
#: the ``linear`` model's one shape parameter (not a coefficient): a pass is charged at least
#: this many rows of ``token_ms`` and of ``seq_ms``. A small batch's matmuls are bound by
#: reading the weights, not by the rows they compute: a real engine's decode step is nearly
#: flat up to a few sequences, then grows with each one (docs/mocker.md "Timing"). 0 = none.
WEIGHT_BOUND_ROWS = "weight_bound_rows"
#: how a profile's ``request`` rows (the ``linear`` model's request terms) apply
#: (docs/mocker.md "Timing"): ``delay`` = the request may not be scheduled before arrival +
#: request(T); ``floor`` = it is scheduled at once, but its first token is not emitted before
#: arrival + request(T) (tokens produced earlier are held and emitted together), as a serving
#: path that holds the first response bytes back while the engine works (Dynamo 1.6.1's TTFT
#: at concurrency 1, docs/fidelity.md)
REQUEST_MODES = ("delay", "floor")
#: under ``delay``, the share of request(T) that comes after the request's first pass instead
#: of before its scheduling: the first token comes out that much after the pass that computed
#: it (a serving path whose extra work is partly on the way out, which keeps no request from
#: its first pass; docs/fidelity.md "Where the request latency sits"). 0 (default) to 1.
REQUEST_AFTER_SHARE = "request_after_share"


def _default_timing() -> dict[str, Any]:
    return {"type": "polynomial"}


@dataclass(frozen=True)
class EngineArgs:
    """Scheduler, KV pool and timing parameters. Construct via `from_json`
    (`mocker.server.config.load_engine_args` reads one from a command line)
    to get validation and the per-engine block-size default; direct construction validates too."""

    engine_type: str = DEFAULT_ENGINE_TYPE
    num_gpu_blocks: int = DEFAULT_NUM_GPU_BLOCKS
    block_size: int = 0  # 0 = the engine type's default (trtllm 32, vllm 64), as the reference
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    speedup_ratio: float = 1.0
    decode_speedup_ratio: float = 1.0
    kv_transfer_bandwidth: float = DEFAULT_KV_TRANSFER_BANDWIDTH_GBPS
    kv_bytes_per_token: int = DEFAULT_KV_BYTES_PER_TOKEN
    timing: dict[str, Any] = field(default_factory=_default_timing)
    #: None = the engine type's default (trtllm true, vllm false)
    first_token_decode: bool | None = None
    #: a reasoning span before the answer (docs/mocker.md "Reasoning spans"): this many output
    #: tokens, or this share of each request's output budget, then the think-end marker; 0 = none
    reasoning_tokens: int = 0
    reasoning_share: float = 0.0

    def __post_init__(self) -> None:
        if self.block_size == 0 and self.engine_type in DEFAULT_BLOCK_SIZE:
            object.__setattr__(self, "block_size", DEFAULT_BLOCK_SIZE[self.engine_type])
        if self.first_token_decode is None and self.engine_type in DEFAULT_FIRST_TOKEN_DECODE:
            object.__setattr__(self, "first_token_decode",
                               DEFAULT_FIRST_TOKEN_DECODE[self.engine_type])
        _validate(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> EngineArgs:
        """Build from a flat JSON object; unknown keys raise ValueError naming the key.

        `block_size` defaults per engine type (trtllm 32, vllm 64) when not given (or 0).
        """
        if not isinstance(obj, dict):
            raise ValueError(f"engine args must be a JSON object, got {type(obj).__name__}")
        known = {f.name for f in fields(cls)}
        for key in obj:
            if key not in known:
                raise ValueError(
                    f"unknown engine arg {key!r} (known: {', '.join(sorted(known))})"
                )
        return cls(**obj)

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def with_overrides(self, **overrides: Any) -> EngineArgs:
        """A copy with some fields replaced (validated; unknown names raise ValueError)."""
        known = {f.name for f in fields(self)}
        for key in overrides:
            if key not in known:
                raise ValueError(f"unknown engine arg {key!r}")
        return replace(self, **overrides)

    @property
    def capacity_tokens(self) -> int:
        """KV pool size in tokens."""
        return self.num_gpu_blocks * self.block_size


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> TypeGuard[float]:
    return (isinstance(v, int | float)) and not isinstance(v, bool) and math.isfinite(v)


def _validate(a: EngineArgs) -> None:
    if a.engine_type not in ENGINE_TYPES:
        raise ValueError(
            f"engine_type must be one of {', '.join(ENGINE_TYPES)}, got {a.engine_type!r}"
        )
    for name in ("num_gpu_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens",
                 "kv_bytes_per_token"):
        v = getattr(a, name)
        if not _is_int(v) or v <= 0:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if a.engine_type == "trtllm" and a.block_size < 2:
        raise ValueError(f"block_size must be >= 2 for trtllm, got {a.block_size!r}")
    for name in ("enable_prefix_caching", "enable_chunked_prefill", "first_token_decode"):
        v = getattr(a, name)
        if not isinstance(v, bool):
            raise ValueError(f"{name} must be true or false, got {v!r}")
    for name in ("speedup_ratio", "decode_speedup_ratio", "kv_transfer_bandwidth"):
        v = getattr(a, name)
        if not _is_num(v) or v < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
    if not _is_int(a.reasoning_tokens) or a.reasoning_tokens < 0:
        raise ValueError(f"reasoning_tokens must be an integer >= 0, got {a.reasoning_tokens!r}")
    if not _is_num(a.reasoning_share) or not 0 <= a.reasoning_share < 1:
        raise ValueError(f"reasoning_share must be a number in [0, 1), got {a.reasoning_share!r}")
    if a.reasoning_tokens and a.reasoning_share:
        raise ValueError("give reasoning_tokens or reasoning_share, not both")
    _validate_timing(a.timing)


def reasoning_span(args: EngineArgs, max_tokens: int) -> int:
    """The reasoning tokens a request of `max_tokens` output tokens emits before the think-end
    marker: `reasoning_tokens`, or `reasoning_share` of the budget (at least 1 when a share is
    given, so a prefill leg, which emits position 0 only, agrees with its decode leg); 0 = no
    span and no marker. A span as long as the budget leaves no room for the marker: the
    request is all reasoning, as a real model cut off by max_tokens."""
    if args.reasoning_tokens:
        return min(args.reasoning_tokens, max_tokens)
    if args.reasoning_share:
        return min(max(1, round(args.reasoning_share * max_tokens)), max_tokens)
    return 0


def _validate_timing(t: Any) -> None:
    if not isinstance(t, dict):
        raise ValueError(f"timing must be an object like {{\"type\": \"polynomial\"}}, got {t!r}")
    kind = t.get("type", "polynomial")
    if kind not in TIMING_TYPES:
        raise ValueError(f"timing.type must be one of {', '.join(TIMING_TYPES)}, got {kind!r}")
    allowed = {"polynomial": {"type"}, "fixed": {"type", "prefill_ms", "decode_ms"},
               "linear": {"type", "request_mode", REQUEST_AFTER_SHARE, WEIGHT_BOUND_ROWS,
                          *LINEAR_TERMS},
               "profile": {"type", "path", "request_mode", REQUEST_AFTER_SHARE}}[kind]
    for key in t:
        if key not in allowed:
            raise ValueError(f"unknown key timing.{key} for timing type {kind!r}")
    if kind == "linear":
        for name in (*LINEAR_TERMS, WEIGHT_BOUND_ROWS):
            v = t.get(name, 0.0)
            if not _is_num(v) or v < 0:
                raise ValueError(f"timing.{name} must be a finite number >= 0, got {v!r}")
    if kind == "fixed":
        for name in ("prefill_ms", "decode_ms"):
            v = t.get(name)
            if not _is_num(v) or v < 0:
                raise ValueError(f"timing.{name} must be a finite number >= 0, got {v!r}")
    if kind == "profile":
        p = t.get("path")
        if not isinstance(p, str) or not p:
            raise ValueError(f"timing.path must be a non-empty file path, got {p!r}")
    mode = t.get("request_mode", REQUEST_MODES[0])
    if mode not in REQUEST_MODES:
        raise ValueError(
            f"timing.request_mode must be one of {', '.join(REQUEST_MODES)}, got {mode!r}")
    share = t.get(REQUEST_AFTER_SHARE, 0.0)
    if not _is_num(share) or not 0.0 <= share <= 1.0:
        raise ValueError(f"timing.{REQUEST_AFTER_SHARE} must be a number from 0 to 1, got "
                         f"{share!r}")
    if share and mode != "delay":
        raise ValueError(f"timing.{REQUEST_AFTER_SHARE} applies to request_mode delay, not "
                         f"{mode!r}")
