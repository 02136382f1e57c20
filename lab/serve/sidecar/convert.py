"""Conversion between request-plane payloads and openengine.v1 messages (docs/request-plane.md,
"Payloads").

Pure functions and one small per-request state object; no I/O, so each rule is unit-testable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc

from lab.serve.handoff import HandoffError, session_from_json, session_to_json
from lab.serve.request_plane.payloads import EndPayload, end_payload
from lab.wire.constants import CONTEXT_ONLY, DETOKENIZE_KEY, REQUEST_TYPE_KEY
from lab.wire.gen.openengine.v1 import error_pb2, generation_pb2, server_pb2

_U32 = 0xFFFFFFFF
_U64 = 0xFFFFFFFFFFFFFFFF

ROLE_NAMES = {
    server_pb2.ENGINE_ROLE_AGGREGATED: "aggregated",
    server_pb2.ENGINE_ROLE_PREFILL: "prefill",
    server_pb2.ENGINE_ROLE_DECODE: "decode",
}

_FINISH = {
    generation_pb2.FINISH_REASON_STOP: "stop",
    generation_pb2.FINISH_REASON_LENGTH: "length",
    generation_pb2.FINISH_REASON_CANCELLED: "cancelled",
}


@dataclass(frozen=True)
class EngineFacts:
    """What the sidecar learned from its engine at start-up."""

    role: str  # "aggregated" | "prefill" | "decode"
    model: str
    context_length: int
    max_output_tokens: int | None = None
    instance_id: str = ""


class RequestError(ValueError):
    """The request cannot be sent to the engine (invalid_request, 400); names the field."""


class ProtocolError(RuntimeError):
    """The engine's stream broke the openengine stream shape."""


@dataclass
class RequestPlan:
    """Per-request facts the response conversion needs."""

    request_id: str
    prompt_tokens: int
    want_logprobs: bool
    top_n: int  # alternatives per token to return (0 = none)
    decode_leg: bool
    prefill_cached_tokens: int | None


def error_payload(kind: str, message: str, status: int) -> dict[str, Any]:
    return {"kind": kind, "message": message, "status": status}


# -- request ------------------------------------------------------------------------------------


def _opt_int(req: dict, name: str, lo: int = 0, hi: int = _U32) -> int | None:
    value = req.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{name!r} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise RequestError(f"{name!r} out of range [{lo}, {hi}]: {value!r}")
    return value


def _opt_float(req: dict, name: str) -> float | None:
    value = req.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestError(f"{name!r} must be a number, got {value!r}")
    return float(value)


def build_generate_request(
    req: dict, facts: EngineFacts
) -> tuple[generation_pb2.GenerateRequest, RequestPlan]:
    """REQUEST payload -> GenerateRequest; RequestError naming the field when it cannot be."""
    request_id = req.get("request_id")
    if not isinstance(request_id, str) or not request_id:
        raise RequestError("'request_id' must be a non-empty string")
    token_ids = req.get("token_ids")
    if not isinstance(token_ids, list) or not token_ids:
        raise RequestError("'token_ids' must be a non-empty list of token ids")
    # C-level passes first (a prompt is hundreds of ids); the loop only names the bad one.
    if set(map(type, token_ids)) != {int} or min(token_ids) < 0 or max(token_ids) > _U32:
        for tok in token_ids:
            if isinstance(tok, bool) or not isinstance(tok, int) or not 0 <= tok <= _U32:
                raise RequestError(f"'token_ids' holds an invalid token id: {tok!r}")
    prompt_len = len(token_ids)
    model = req.get("model") or facts.model

    handoff = req.get("handoff")
    decode_leg = handoff is not None
    if decode_leg and facts.role != "decode":
        raise RequestError(
            f"'handoff' sent to a {facts.role} worker (only decode workers take one)"
        )
    prefill = facts.role == "prefill"

    max_tokens = _opt_int(req, "max_tokens")
    min_tokens = _opt_int(req, "min_tokens")
    if prefill:
        max_tokens = 1
        if min_tokens is not None:
            min_tokens = min(min_tokens, 1)  # a one-token context leg
    elif max_tokens is None:
        budget = max(1, facts.context_length - prompt_len)
        if facts.max_output_tokens:
            budget = min(budget, facts.max_output_tokens)
        if min_tokens is not None and min_tokens > budget:
            raise RequestError(
                f"'min_tokens' {min_tokens} exceeds the output budget {budget} "
                f"(context length {facts.context_length} - prompt {prompt_len})"
            )
        max_tokens = budget

    stopping = generation_pb2.StoppingOptions(max_tokens=max_tokens)
    if min_tokens is not None:
        stopping.min_tokens = min_tokens
    ignore_eos = req.get("ignore_eos")
    if ignore_eos is not None:
        if not isinstance(ignore_eos, bool):
            raise RequestError(f"'ignore_eos' must be a boolean, got {ignore_eos!r}")
        stopping.ignore_eos = ignore_eos
    stop_ids = req.get("stop_token_ids") or []
    if not isinstance(stop_ids, list):
        raise RequestError("'stop_token_ids' must be a list of token ids")
    for tok in stop_ids:
        if isinstance(tok, bool) or not isinstance(tok, int) or not 0 <= tok <= _U32:
            raise RequestError(f"'stop_token_ids' holds an invalid token id: {tok!r}")
    for tok in sorted(set(stop_ids)):
        stopping.conditions.add(stop_token_id=tok)

    sampling = generation_pb2.SamplingParams(num_sequences=1)
    temperature = _opt_float(req, "temperature")
    if temperature is not None:
        sampling.temperature = temperature
    top_p = _opt_float(req, "top_p")
    if top_p is not None:
        sampling.top_p = top_p
    top_k = _opt_int(req, "top_k", lo=-(2**31), hi=2**31 - 1)
    if top_k is not None and top_k not in (0, -1):
        if top_k < 0:
            raise RequestError(f"'top_k' must be positive, 0 or -1 (unset), got {top_k}")
        sampling.top_k = top_k
    seed = _opt_int(req, "seed", hi=_U64)
    if seed is not None:
        sampling.seed = seed

    want_logprobs = bool(req.get("logprobs"))
    top_logprobs = _opt_int(req, "top_logprobs", hi=_U32) or 0
    response = None
    if want_logprobs:
        response = generation_pb2.ResponseOptions(
            return_output_logprobs=True,
            output_candidates=generation_pb2.CandidateTokenSelection(top_n=max(1, top_logprobs)),
        )

    greq = generation_pb2.GenerateRequest(
        request_id=request_id,
        model=model,
        token_ids=generation_pb2.TokenIds(ids=token_ids),
        sampling=sampling,
        stopping=stopping,
        response=response,
    )
    greq.extra[DETOKENIZE_KEY] = False
    if prefill:
        greq.extra[REQUEST_TYPE_KEY] = CONTEXT_ONLY
    if decode_leg:
        try:
            greq.kv.session.CopyFrom(session_from_json(handoff))
        except HandoffError as exc:
            raise RequestError(str(exc)) from exc

    cached = _opt_int(req, "prefill_cached_tokens") if decode_leg else None
    plan = RequestPlan(
        request_id=request_id,
        prompt_tokens=prompt_len,
        want_logprobs=want_logprobs,
        top_n=top_logprobs if want_logprobs else 0,
        decode_leg=decode_leg,
        prefill_cached_tokens=cached,
    )
    return greq, plan


# -- response -----------------------------------------------------------------------------------


class ResponseConverter:
    """Turns the events of one Generate stream into CHUNK / END payloads.

    `token()` returns a CHUNK payload (or None: text-only delta, or held on a prefill worker);
    `terminal()` returns (final CHUNK or None, END payload). Protocol violations raise
    ProtocolError.
    """

    __slots__ = ("_held", "completion_tokens", "plan", "prefill", "worker_id")

    def __init__(self, plan: RequestPlan, role: str, worker_id: str) -> None:
        self.plan = plan
        self.prefill = role == "prefill"
        self.worker_id = worker_id
        self.completion_tokens = 0
        self._held: dict | None = None

    def token(self, out: generation_pb2.TokenOutput) -> dict | None:
        if not out.HasField("output_index") or out.output_index != 0:
            raise ProtocolError("token event without output_index 0")
        tokens = out.tokens
        if not tokens:
            return None
        plan = self.plan
        payload: dict[str, Any] = {"t": [t.token_id for t in tokens]}
        if plan.want_logprobs:
            payload["lp"] = [t.logprob if t.HasField("logprob") else None for t in tokens]
            if plan.top_n:
                n = plan.top_n
                payload["top"] = [
                    [[c.token_id, c.logprob] for c in t.candidates[:n]] for t in tokens
                ]
        self.completion_tokens += len(tokens)
        if self.prefill:
            if self._held is None:
                self._held = payload
            else:
                for key, values in payload.items():
                    self._held[key].extend(values)
            return None
        return payload

    def _usage(self, msg: generation_pb2.GenerateResponse, completion: int | None = None) -> dict:
        plan = self.plan
        if msg.HasField("usage"):
            usage = msg.usage
            prompt = usage.prompt_tokens
            done = usage.completion_tokens if completion is None else completion
            engine_cached = (
                usage.cached_prompt_tokens if usage.HasField("cached_prompt_tokens") else 0
            )
        else:
            prompt = plan.prompt_tokens
            done = self.completion_tokens if completion is None else completion
            engine_cached = 0
        if plan.decode_leg and plan.prefill_cached_tokens is not None:
            cached = plan.prefill_cached_tokens
        else:
            cached = engine_cached
        return {
            "prompt_tokens": prompt,
            "completion_tokens": done,
            "cached_tokens": min(cached, prompt),
        }

    def end(self, **fields: Any) -> EndPayload:
        """This stream's END: `fields` are EndPayload keys; the worker id is this sidecar's."""
        return end_payload(worker_id=self.worker_id, **fields)

    def terminal(
        self, msg: generation_pb2.GenerateResponse, kind: str
    ) -> tuple[dict | None, EndPayload]:
        if kind == "finished":
            fin = msg.finished
            if not fin.HasField("output_index") or fin.output_index != 0:
                raise ProtocolError("finished event without output_index 0")
            finish = _FINISH.get(fin.reason)
            if finish is None:
                raise ProtocolError("finished event with FINISH_REASON_UNSPECIFIED")
            if self.prefill and finish == "length":
                raise ProtocolError(
                    "the prefill engine finished with LENGTH but sent no PrefillReady: "
                    "disaggregation is not configured on the engine"
                )
            match = fin.stop_match.WhichOneof("match") if fin.HasField("stop_match") else None
            stop_reason = getattr(fin.stop_match, match) if match else None
            held, self._held = self._held, None
            return held, self.end(finish=finish, stop_reason=stop_reason, usage=self._usage(msg))
        if kind == "prefill_ready":
            if not self.prefill:
                raise ProtocolError("PrefillReady from an engine that is not serving as prefill")
            self._held = None
            return None, self.end(
                finish="length",
                usage=self._usage(msg, completion=0),
                handoff=session_to_json(msg.prefill_ready.kv_session),
            )
        if kind == "error":
            return None, self.end(error=engine_error(msg.error), usage=self._usage(msg))
        raise ProtocolError(f"unexpected {kind or 'empty'} event in the Generate stream")

    def cancelled_end(self) -> EndPayload:
        """The END of a request the frontend cancelled (usage so far)."""
        plan = self.plan
        return self.end(
            finish="cancelled",
            usage={
                "prompt_tokens": plan.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "cached_tokens": 0,
            },
        )


def engine_error(err: error_pb2.EngineError) -> dict[str, Any]:
    """An in-band EngineError -> the END error the frontend acts on."""
    code = err.code
    name = error_pb2.ErrorCode.Name(code) if code in error_pb2.ErrorCode.values() else str(code)
    text = f"engine error {name}: {err.message}"
    if code in (error_pb2.ERROR_CODE_INVALID_ARGUMENT, error_pb2.ERROR_CODE_UNSUPPORTED_FEATURE):
        return error_payload("invalid_request", text, 400)
    if code == error_pb2.ERROR_CODE_ROLE_MISMATCH:
        return error_payload(
            "invalid_request",
            text + " (hint: the request's phase does not match the engine's "
            "role: check which fleet the frontend routed it to)",
            400,
        )
    if code == error_pb2.ERROR_CODE_OVERLOADED:
        # Only a stalled consumer triggers it; not worth migrating (reference behaviour).
        return error_payload("engine_error", text, 500)
    if code == error_pb2.ERROR_CODE_CANCELLED:
        return error_payload("cancelled", text, 499)
    if code in (error_pb2.ERROR_CODE_KV_SESSION_NOT_FOUND, error_pb2.ERROR_CODE_KV_TRANSFER_FAILED):
        return error_payload(
            "engine_error",
            text + " (hint: the decode engine could not use the prefill "
            "handoff: the prefill leg may have expired, been aborted, or the handoff was "
            "mangled between the legs)",
            500,
        )
    return error_payload("engine_error", text, 500)


_INVALID_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ALREADY_EXISTS,
}
_RETRYABLE_STATUS = {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE}


def rpc_error(code: grpc.StatusCode, details: str | None) -> dict[str, Any]:
    """A non-OK gRPC status of Generate -> the END error."""
    text = f"engine rejected the request: {code.name}: {details or ''}".rstrip(": ")
    if code in _INVALID_STATUS:
        return error_payload("invalid_request", text, 400)
    if code in _RETRYABLE_STATUS:
        return error_payload("retryable", text, 503)
    if code == grpc.StatusCode.CANCELLED:
        return error_payload("cancelled", text, 499)
    return error_payload("engine_error", text, 500)
