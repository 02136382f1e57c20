"""Request preparation: every check a Generate request passes before it is admitted, in the
reference order (docs/mocker.md "Validation order", items 2-9). The concurrency permit (1) and the
duplicate-id claim (10) live in the servicer because they touch shared state.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from lab.wire import constants as wc

from .config import DEFAULT_MAX_TOKENS, MAX_OUTPUT_TOKENS, ServerConfig
from .errors import RequestRefused, invalid, not_simulated, unimplemented
from .handoff import Handoff, validate_session
from .pb import generation_pb2
from .tokens_out import Candidates


@dataclass(slots=True)
class Prepared:
    request_id: str
    prompt: list[int]
    max_tokens: int
    min_tokens: int
    stop_ids: frozenset[int]
    output_logprobs: bool
    output_candidates: Candidates | None
    prompt_logprobs: bool
    prompt_candidates: Candidates | None
    context_only: bool
    handoff: Handoff | None


def _is_context_only(request: generation_pb2.GenerateRequest) -> bool:
    if not request.HasField("extra"):
        return False
    v = request.extra.fields.get(wc.REQUEST_TYPE_KEY)
    return v is not None and v.WhichOneof("kind") == "string_value" and (
        v.string_value == wc.CONTEXT_ONLY
    )


def _refuse_unsupported(request: generation_pb2.GenerateRequest) -> None:
    if len(request.media):
        raise not_simulated("multimodal input (media)")
    if request.lora_name:
        raise not_simulated("LoRA (lora_name)")
    if request.HasField("sampling") and request.sampling.HasField("num_sequences"):
        n = request.sampling.num_sequences
        if n not in (0, 1):
            raise not_simulated(f"sampling.num_sequences={n}")
    if request.HasField("guided"):
        raise not_simulated("guided decoding")
    if request.HasField("kv"):
        kv = request.kv
        if kv.HasField("bypass_prefix_cache") and kv.bypass_prefix_cache:
            raise not_simulated("kv.bypass_prefix_cache")
        if kv.HasField("cache_salt") and kv.cache_salt:
            raise not_simulated("kv.cache_salt")


def _input(request: generation_pb2.GenerateRequest) -> list[int]:
    kind = request.WhichOneof("input")
    if kind == "prompt":
        raise unimplemented(
            "a text prompt is not simulated by the Mocker server (no tokenizer; send token_ids)"
        )
    if kind is None:
        raise invalid("the request has no input (send token_ids)")
    ids = list(request.token_ids.ids)
    if not ids:
        raise invalid("token_ids must be non-empty")
    return ids


def _role(request: generation_pb2.GenerateRequest, role: str) -> tuple[bool, bool]:
    context_only = _is_context_only(request)
    has_session = request.HasField("kv") and request.kv.HasField("session")
    if context_only and has_session:
        raise invalid(
            "a request cannot be both context_only (extra.request_type) and carry a kv.session"
        )
    if context_only and role != "prefill":
        raise RequestRefused(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"a context_only request must go to a prefill server; this server's role is {role}",
        )
    if has_session and role != "decode":
        raise RequestRefused(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"a request with a kv.session must go to a decode server; this server's role is {role}",
        )
    if not context_only and not has_session and role == "prefill":
        raise RequestRefused(
            grpc.StatusCode.FAILED_PRECONDITION,
            "a prefill server only serves context_only requests (extra.request_type)",
        )
    return context_only, has_session


def _max_tokens(
    stopping: generation_pb2.StoppingOptions, context_only: bool, prompt_len: int, cfg: ServerConfig
) -> tuple[int, int]:
    explicit = stopping.HasField("max_tokens")
    requested = stopping.max_tokens if explicit else None
    min_tokens = stopping.min_tokens if stopping.HasField("min_tokens") else 0
    if context_only:
        if requested != 1:
            raise invalid("a context_only request must ask for exactly one token (max_tokens=1)")
        # A context leg's budget is its one token, whatever the client's min_tokens: Dynamo's
        # sidecar forwards the client's min_tokens on the prefill leg, and the reference TRT-LLM
        # mocker (lib/mocker/servers/trtllm, max_output_tokens) returns the one-token budget
        # before it ever compares min_tokens, so such a leg is served, not refused.
        min_tokens = min(min_tokens, 1)
    elif explicit and requested == 0:
        raise invalid("max_tokens must be greater than zero")
    max_tokens = requested if requested is not None else DEFAULT_MAX_TOKENS
    if max_tokens > MAX_OUTPUT_TOKENS:
        raise invalid(f"max_tokens {max_tokens} exceeds the Mocker limit of {MAX_OUTPUT_TOKENS}")
    if min_tokens > max_tokens:
        raise invalid(f"min_tokens {min_tokens} exceeds max_tokens {max_tokens}")
    if prompt_len >= cfg.settings.context_length:
        raise invalid(
            f"the prompt of {prompt_len} tokens leaves no room in the context length of "
            f"{cfg.settings.context_length}"
        )
    # Newest reference: clamp the budget to the rest of the context window.
    return min(max_tokens, cfg.settings.context_length - prompt_len), min_tokens


def prepare(request: generation_pb2.GenerateRequest, cfg: ServerConfig) -> Prepared:
    """Validate `request`; raises RequestRefused with the gRPC status to answer."""
    if not request.request_id:
        raise invalid("request_id must be non-empty")
    if not request.model:
        raise invalid("model must be non-empty")
    _refuse_unsupported(request)
    prompt = _input(request)
    context_only, has_session = _role(request, cfg.settings.role)
    handoff = validate_session(request.kv.session) if has_session else None
    max_tokens, min_tokens = _max_tokens(request.stopping, context_only, len(prompt), cfg)

    stop_ids = frozenset(
        c.stop_token_id
        for c in request.stopping.conditions
        if c.WhichOneof("condition") == "stop_token_id"
    )
    resp = request.response
    output_logprobs = resp.HasField("return_output_logprobs") and resp.return_output_logprobs
    prompt_logprobs = resp.HasField("return_prompt_logprobs") and resp.return_prompt_logprobs
    return Prepared(
        request_id=request.request_id,
        prompt=prompt,
        max_tokens=max_tokens,
        min_tokens=min_tokens,
        stop_ids=stop_ids,
        output_logprobs=output_logprobs,
        output_candidates=(
            Candidates.parse(resp.output_candidates, resp.HasField("output_candidates"))
            if output_logprobs
            else None
        ),
        prompt_logprobs=prompt_logprobs,
        prompt_candidates=(
            Candidates.parse(resp.prompt_candidates, resp.HasField("prompt_candidates"))
            if prompt_logprobs
            else None
        ),
        context_only=context_only,
        handoff=handoff,
    )
