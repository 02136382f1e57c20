"""openengine.v1 Inference.Generate: admission, streaming and the one terminal event.

Stream shape: `[PromptOutput]? TokenOutput* (GenerationFinished | PrefillReady | EngineError)`,
exactly one terminal (chosen by `terminal()` from an `Exit`), usage only on the terminal, never
an empty event. Each TokenOutput holds one engine step's token, or `stream_interval` tokens
(and the last ones) when that is set above 1; see engine_loop.py for the pacing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import grpc

from mocker.engine import (
    EngineRequest,
    kv_transfer_ms,
    reasoning_span,
    synthetic_logprob,
    token_deriver,
    with_reasoning_span,
)

from .errors import RequestRefused
from .fastwire import response_prefix, single_token_event, token_event
from .handoff import stamp_session
from .inflight import Exit, LiveRequest
from .pb import error_pb2, generation_pb2, openengine_pb2_grpc
from .state import ServerState
from .tokens_out import prompt_output, scored_info
from .validation import Prepared, prepare

log = logging.getLogger("mocker.server")

GenerateResponse = generation_pb2.GenerateResponse
TokenOutput = generation_pb2.TokenOutput
Usage = generation_pb2.Usage
EngineError = error_pb2.EngineError

CAPACITY_MESSAGE = "request exceeds the simulated KV-cache capacity"


def add_inference(servicer: Inference, server: grpc.aio.Server) -> None:
    """Register Generate with a pass-through response serializer: it yields encoded bytes."""
    handler = grpc.method_handlers_generic_handler(
        "openengine.v1.Inference",
        {
            "Generate": grpc.unary_stream_rpc_method_handler(
                servicer.Generate,
                request_deserializer=generation_pb2.GenerateRequest.FromString,
                response_serializer=None,
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))


#: The exits that end a stream with GenerationFinished, and its reason.
_FINISH_REASONS = {
    Exit.COMPLETED: generation_pb2.FINISH_REASON_LENGTH,
    Exit.STOPPED: generation_pb2.FINISH_REASON_STOP,
    Exit.ABORTED: generation_pb2.FINISH_REASON_CANCELLED,
}


def _internal_error_message(exit_: Exit, live: LiveRequest) -> str:
    """The message of the non-retryable INTERNAL EngineError that ends a stream on `exit_`."""
    if exit_ is Exit.REJECTED:
        return CAPACITY_MESSAGE
    if exit_ is Exit.FAILED:
        return f"executor failure: {live.failure}"
    if exit_ is Exit.MISSING_TOKEN:
        return "the simulated engine produced an output without a token"
    return "the simulated engine closed the request before it completed"


class Inference(openengine_pb2_grpc.InferenceServicer):
    def __init__(self, state: ServerState) -> None:
        self._st = state

    def terminal(
        self,
        exit_: Exit,
        live: LiveRequest,
        prep: Prepared,
        streamed: int,
        stop_token: int,
        first_token: int,
        first_logprob: float | None,
    ) -> generation_pb2.GenerateResponse:
        """The single place a stream's terminal event is chosen."""
        rid = prep.request_id
        prompt_len = len(prep.prompt)
        cached = max(0, min(live.cached, prompt_len - 1))
        if exit_ is Exit.COMPLETED and prep.context_only:
            cfg = self._st.cfg
            session = stamp_session(
                seed=cfg.settings.seed,
                request_id=rid,
                prompt_tokens=prompt_len,
                first_token=first_token,
                first_logprob=first_logprob if prep.output_logprobs else None,
                kv_host=cfg.settings.kv_host,
                kv_port=cfg.settings.kv_port,
            )
            return GenerateResponse(
                request_id=rid,
                prefill_ready=generation_pb2.PrefillReady(kv_session=session),
                usage=Usage(
                    prompt_tokens=prompt_len,
                    completion_tokens=1,
                    total_tokens=prompt_len + 1,
                    cached_prompt_tokens=cached,
                ),
            )
        usage = Usage(
            prompt_tokens=prompt_len,
            completion_tokens=streamed,
            total_tokens=prompt_len + streamed,
            cached_prompt_tokens=cached,
        )
        reason = _FINISH_REASONS.get(exit_)
        if reason is not None:
            details: dict[str, Any] = {}
            if exit_ is Exit.STOPPED:
                details["stop_match"] = generation_pb2.StopMatch(stop_token_id=stop_token)
            elif exit_ is Exit.ABORTED:
                details["message"] = "aborted"
            finished = generation_pb2.GenerationFinished(output_index=0, reason=reason, **details)
            return GenerateResponse(request_id=rid, finished=finished, usage=usage)
        if exit_ is Exit.STALLED:
            error = EngineError(
                code=error_pb2.ERROR_CODE_OVERLOADED,
                message=(
                    f"the client did not drain the response stream for "
                    f"{self._st.cfg.settings.stall_timeout:g} s; the request was aborted"
                ),
                retryable=True,
            )
        else:
            error = EngineError(code=error_pb2.ERROR_CODE_INTERNAL,
                                message=_internal_error_message(exit_, live), retryable=False)
        return GenerateResponse(request_id=rid, error=error)

    def _token_at(self, rid: str, max_tokens: int) -> Callable[[int], int]:
        """The request's `position -> token id`: the seeded deriver, with the think-end marker
        after the reasoning span when the engine args configure one (docs/mocker.md
        "Reasoning spans"; a prefill leg's budget of 1 makes position 0 reasoning, as its
        decode leg's span does)."""
        cfg = self._st.cfg
        token_at = token_deriver(cfg.settings.seed, rid, cfg.allowed_ids)
        if cfg.think_end is None:
            return token_at
        span = reasoning_span(cfg.engine, max_tokens)
        return with_reasoning_span(token_at, span, cfg.think_end) if span < max_tokens else token_at

    def _admit(
        self, request: generation_pb2.GenerateRequest
    ) -> tuple[LiveRequest, Prepared, float]:
        """Admission: the concurrency permit, validation (docs/mocker.md "Validation order") and
        the duplicate-id check, each refusal a RequestRefused (a gRPC status) before anything is
        held. Then the request takes a permit and is registered (`ServerState.release` frees
        both) and submitted to the engine loop. Returns it, its prepared form and how long a
        decode leg waits for its simulated KV transfer."""
        st = self._st
        if st.active >= st.cfg.settings.max_concurrent_requests:
            raise RequestRefused(
                grpc.StatusCode.RESOURCE_EXHAUSTED, "Mocker concurrent request limit reached"
            )
        if st.executor_failure is not None:
            raise RequestRefused(
                grpc.StatusCode.UNAVAILABLE,
                f"the simulated executor failed: {st.executor_failure}",
            )
        prep = prepare(request, st.cfg)
        rid = prep.request_id
        if rid in st.by_id:
            raise RequestRefused(
                grpc.StatusCode.ALREADY_EXISTS, f"request_id {rid!r} is already active"
            )
        engine = st.engine
        kv_wait_s = 0.0
        # A decode leg resumes after the prefill's first token, once its KV has arrived; with
        # max_tokens 1 that token is all it sends and the engine never runs it.
        resume: dict[str, Any] = {}
        if prep.handoff is not None:
            kv_ms = kv_transfer_ms(st.cfg.engine, len(prep.prompt))
            kv_wait_s = kv_ms / 1000.0
            resume = {"first_position": 1, "kv_transferred": True,
                      "ready_at_ms": engine.now_ms() + kv_ms}
        elif any(parts := engine.scheduler.timing.request_parts_ms(len(prep.prompt))):
            # the timing's per-request latency (mocker/engine/timing.py): holds no pass; its
            # after-share holds the first token back instead of the request
            resume = {"ready_at_ms": engine.now_ms() + parts[0], "first_delay_ms": parts[1]}
        live = st.register(rid, prep.handoff is not None)
        if prep.handoff is None or prep.max_tokens > 1:
            engine.submit(
                live,
                EngineRequest(
                    key=live.key,
                    prompt=prep.prompt,
                    max_output_tokens=prep.max_tokens,
                    token_at=self._token_at(rid, prep.max_tokens),
                    **resume,
                ),
            )
        st.recorder.record(request)
        return live, prep, kv_wait_s

    @staticmethod
    async def _replay_handoff(live: LiveRequest, prep: Prepared, kv_wait_s: float) -> None:
        """A decode leg: wait out the simulated KV transfer; then the prefill's first token
        goes out first."""
        handoff = prep.handoff
        assert handoff is not None
        if kv_wait_s > 0.0:
            await asyncio.sleep(kv_wait_s)
        live.replay(handoff.first_token, last=prep.max_tokens <= 1)

    async def Generate(self, request, context):
        """Admission, the handoff replay, the streaming loop, the terminal (in that order)."""
        st = self._st
        try:
            live, prep, kv_wait_s = self._admit(request)
        except RequestRefused as refused:
            await context.abort(refused.code, refused.message)  # raises
            return
        released = False
        try:
            rid = prep.request_id
            handoff = prep.handoff
            loop = asyncio.get_running_loop()
            if prep.prompt_logprobs:
                msg = GenerateResponse(
                    request_id=rid, prompt=prompt_output(prep.prompt, prep.prompt_candidates)
                ).SerializeToString()
                live.write_started = loop.time()
                yield msg
                live.write_started = 0.0
            if handoff is not None:
                await self._replay_handoff(live, prep, kv_wait_s)

            # The streaming loop: the hot path, so everything it uses per token is a local.
            prefix = response_prefix(rid)
            single = single_token_event
            flowing = st.tokens_flowing
            interval = st.cfg.settings.stream_interval
            ack = st.engine.ack
            take = live.take
            stop_ids = prep.stop_ids
            min_tokens = prep.min_tokens
            want_lp = prep.output_logprobs
            cands = prep.output_candidates
            replay_lp = handoff.first_logprob if handoff is not None else None
            streamed = 0
            position = 0
            first_token = 0
            first_lp: float | None = None
            stop_token = 0
            exit_: Exit | None = None  # the stream's own exit; None when someone claimed it
            # One TokenOutput per engine pass (per `interval` passes, plus the last): the engine
            # hands each stream one token per pass (several passes' at once when it runs
            # ahead), and this loop never merges more into one message.
            while True:
                if live.claimed:
                    break
                toks = live.tokens
                if len(toks) < interval and live.exit is None:
                    ack(live)  # seen: the engine may run the next pass
                    fut = loop.create_future()
                    live.waiter = fut
                    await fut
                    continue
                if not flowing.is_set():
                    await flowing.wait()
                    continue
                if not toks:
                    exit_ = live.exit  # drained: how the engine ended it
                    break
                out: list = []
                for t in take(interval):
                    if stop_ids and t in stop_ids and streamed + len(out) >= min_tokens:
                        exit_ = Exit.STOPPED
                        stop_token = t
                        break
                    if want_lp:
                        if position == 0:
                            lp = replay_lp if handoff is not None else synthetic_logprob(t)
                            first_lp = lp
                        else:
                            lp = synthetic_logprob(t)
                        out.append(scored_info(t, lp, cands))
                    else:
                        out.append(t)
                    if position == 0:
                        first_token = t
                    position += 1
                if not toks:
                    # all taken: the next step may run while these are written. A stream
                    # still holding tokens of a run-ahead step drains them first (without
                    # suspending unless its HTTP/2 window is full), so it never holds more
                    # than one step's tokens.
                    ack(live)
                if out:
                    if want_lp:
                        msg = GenerateResponse(
                            request_id=rid,
                            token=TokenOutput(
                                output_index=0,
                                tokens=out,
                                text="".join([i.token for i in out]),
                            ),
                        ).SerializeToString()
                    elif len(out) == 1:
                        msg = single(prefix, out[0])
                    else:
                        msg = token_event(prefix, out)
                    live.write_started = loop.time()
                    yield msg
                    live.write_started = 0.0
                    streamed += len(out)
                    st.token_messages += 1
                    st.tokens_streamed += len(out)
                if exit_ is not None:
                    break

            final = self.terminal(
                live.finish(exit_), live, prep, streamed, stop_token, first_token, first_lp
            ).SerializeToString()
            # Free the permit and the request id before the terminal goes out: a client that
            # sends its next request as soon as it sees the terminal must find them free.
            released = True
            st.release(live)
            yield final
        finally:
            if not released:
                st.release(live)
