"""The aiohttp application: OpenAI endpoints, health, metrics.

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health,
GET /live, GET /metrics, and with `--debug-endpoints` GET /debug/conn (this connection's
TCP_NODELAY, for tests and the Nagle experiments; off by default, as the engine's admin service
is).

Streaming responses send their headers together with the first event, so an error that
happens before the first token (no worker, invalid request found by the engine, ...) still gets
its proper HTTP status; after that, an error becomes an SSE error event followed by [DONE].
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import uuid
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from lab.serve.frontend.config import DEFAULT_COMPLETIONS_MAX_TOKENS
from lab.serve.frontend.dispatch import Dispatcher
from lab.serve.frontend.encode import (
    DONE,
    SSE_HEADERS,
    Logprobs,
    StreamEncoder,
    full_response,
    nvext_obj,
    usage_obj,
)
from lab.serve.frontend.errors import ApiError
from lab.serve.frontend.httplog import RateLimitedLog
from lab.serve.frontend.metrics import FrontendMetrics
from lab.serve.frontend.protocol import (
    GenRequest,
    completion_prompt,
    parse_chat,
    parse_completion,
)
from lab.serve.frontend.reasoning import ReasoningDecoder, ReasoningEncoder, split_reasoning
from lab.serve.frontend.trace import Trace
from lab.serve.frontend.workers import AGGREGATED_ROLES, WorkerSet
from lab.serve.frontend.writer import SseWriter, UnaryWriter
from lab.serve.tokenizer import Tokenizer
from lab.shared.frontend_settings import FrontendSettings
from lab.shared.reasoning import think_end_id

log = logging.getLogger("lab.frontend")

_CLIENT_GONE = (ConnectionResetError, ConnectionError)
# Reading a request body that is corrupt (bad gzip, a broken chunked encoding, ...).
_BAD_BODY = (RequestPayloadError, HttpProcessingError, web.HTTPBadRequest, ValueError)
# Responses after which the connection cannot be reused (the body was not read).
_CLOSE_AFTER = frozenset({408, 413})
_internal_log = RateLimitedLog(log, per_s=1.0, burst=5)


def _outcome(status: int) -> str:
    if status < 400:
        return "success"
    if status == 404:
        return "not_found"
    if status == 499:
        return "cancelled"
    if status == 503:
        return "unavailable"
    if status == 500:
        return "engine_error"
    if status < 500:
        return "invalid"
    return "engine_error"


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def _decompress(raw: bytes, encoding: str, limit: int) -> bytes:
    """A gzip / deflate request body, decompressed to at most `limit` bytes (a bomb is a 413,
    a corrupt body a 400, another encoding a 415)."""
    if encoding not in ("gzip", "x-gzip", "deflate"):
        raise ApiError(415, f"unsupported Content-Encoding {encoding[:32]!r} (gzip and deflate "
                       "are accepted)", code="unsupported_encoding")
    # wbits 47: zlib or gzip header, detected; deflate without a header is tried next.
    for wbits in (47, -15):
        decomp = zlib.decompressobj(wbits)
        try:
            out = decomp.decompress(raw, limit + 1)
        except zlib.error as exc:
            if wbits == 47 and encoding == "deflate":
                continue
            raise ApiError(400, f"unreadable request body (Content-Encoding: {encoding}): {exc}",
                           code="invalid_body") from None
        if len(out) > limit:
            raise ApiError(413, f"request body exceeds the limit of {limit} bytes once "
                           f"decompressed (Content-Encoding: {encoding})", code="body_too_large")
        if not decomp.eof:
            raise ApiError(400, f"unreadable request body (Content-Encoding: {encoding}): "
                           "truncated", code="invalid_body")
        return out
    raise AssertionError("unreachable")


def _is_json_type(media_type: str) -> bool:
    """application/json or a +json type (parameters such as charset are allowed). A request
    with no Content-Type at all is read as JSON."""
    return media_type == "application/json" or (
        media_type.startswith("application/") and media_type.endswith("+json")
    )


#: A request body at least this large is parsed (its prompt tokenized) in a worker thread when
#: the tokenizer releases the GIL (`Tokenizer.releases_gil`): the event loop keeps writing the
#: other streams' tokens meanwhile, and a second core can tokenize. Below it the thread hop
#: (~0.1 ms) costs more than the encode (a 2 KB text is ~450 tokens, ~0.6 ms with the HF
#: tokenizer; docs/token-path.md "The lab path's per-prompt-token cost").
OFFLOAD_BODY_BYTES = 2048
#: Threads of that pool: the encodes run in Rust without the GIL, so more than the cores the
#: frontend may use would only queue.
TOKENIZE_THREADS = 2


def _has_text(body: Any, endpoint: str) -> bool:
    """Whether the body's prompt is text for the tokenizer (chat messages always are); a body
    that is not an object is refused by the parse, inline."""
    if not isinstance(body, dict):
        return False
    if endpoint == "chat":
        return True
    return isinstance(completion_prompt(body), str)


def _error(exc: ApiError) -> web.Response:
    resp = web.Response(body=exc.json_bytes(), status=exc.status, content_type="application/json")
    if exc.status in _CLOSE_AFTER:
        resp.force_close()
    return resp


class FrontendApp:
    def __init__(
        self,
        config: FrontendSettings,
        workers: WorkerSet,
        dispatcher: Dispatcher,
        tokenizer: Tokenizer,
        metrics: FrontendMetrics | None = None,
    ) -> None:
        self.config = config
        self.workers = workers
        self.dispatcher = dispatcher
        self.tokenizer = tokenizer
        #: the think-end id a chat answer is split at (--reasoning-parser), None without one
        self.think_end = think_end_id(config.tokenizer) if config.reasoning_parser else None
        self.metrics = metrics or FrontendMetrics()
        self.started = int(time.time())
        self._pool: ThreadPoolExecutor | None = None

    def close(self) -> None:
        """Join the tokenizing threads (the server calls it once the listener is down)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def build(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body_bytes)
        app.router.add_post("/v1/completions", self.completions, expect_handler=self.expect)
        app.router.add_post(
            "/v1/chat/completions", self.chat_completions, expect_handler=self.expect
        )
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/live", self.live)
        app.router.add_get("/metrics", self.metrics_handler)
        if self.config.debug_endpoints:
            app.router.add_get("/debug/conn", self.debug_conn)
        return app

    # --- plain endpoints -----------------------------------------------------------------------

    def served_models(self) -> list[str]:
        models = set(self.workers.models())
        models.add(self.config.model_name)
        return sorted(models)

    async def models(self, request: web.Request) -> web.Response:
        data = [
            {"id": m, "object": "model", "created": self.started, "owned_by": "loadlab"}
            for m in self.served_models()
        ]
        return _json({"object": "list", "data": data})

    def health_state(self) -> tuple[str, dict[str, int]]:
        """"healthy": every expected worker is registered; "degraded": some are missing but a
        request can still be served (an aggregated or decode worker, and a prefill worker too
        under --enforce-disagg); "unhealthy": no request can be served."""
        counts = self.workers.counts()
        if self.config.expect:
            complete = all(counts.get(role, 0) >= n for role, n in self.config.expect.items())
        else:
            complete = sum(counts.values()) >= 1
        if complete:
            return "healthy", counts
        serving = sum(counts.get(role, 0) for role in AGGREGATED_ROLES) >= 1
        if self.config.enforce_disagg:
            serving = counts.get("prefill", 0) >= 1 and counts.get("decode", 0) >= 1
        return ("degraded" if serving else "unhealthy"), counts

    async def health(self, request: web.Request) -> web.Response:
        """200 while requests can be served (healthy or degraded: a load balancer keeps a
        frontend that still serves), 503 when none can."""
        state, counts = self.health_state()
        body = {
            "status": state,
            "workers": counts,
            "expect": self.config.expect or {"any": 1},
        }
        return _json(body, 503 if state == "unhealthy" else 200)

    async def live(self, request: web.Request) -> web.Response:
        return _json({"status": "live"})

    async def metrics_handler(self, request: web.Request) -> web.Response:
        text = self.metrics.render(
            self.workers.counts(), [(w.worker_id, w.inflight) for w in self.workers.all()]
        )
        return web.Response(
            text=text,
            content_type="text/plain",
            charset="utf-8",
            headers={"X-Content-Type-Options": "nosniff"},
        )

    async def debug_conn(self, request: web.Request) -> web.Response:
        transport = request.transport
        sock = transport.get_extra_info("socket") if transport is not None else None
        if transport is None or sock is None:
            return _json({"tcp_nodelay": None})
        value = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        return _json(
            {
                "tcp_nodelay": int(bool(value)),
                "peer": list(transport.get_extra_info("peername") or []),
            }
        )

    async def expect(self, request: web.Request) -> web.StreamResponse | None:
        """`Expect: 100-continue`: an oversized Content-Length gets its 413 instead of the
        100 Continue (the client never sends the body); anything else continues."""
        expect = request.headers.get("Expect", "")
        if request.version != (1, 1):
            return None
        if expect.lower() != "100-continue":
            return _error(
                ApiError(417, f"unsupported Expect: {expect[:64]!r}", code="expectation_failed")
            )
        limit = self.config.max_body_bytes
        length = request.content_length
        if length is not None and length > limit:
            return _error(
                ApiError(
                    413,
                    f"request body of {length} bytes exceeds the limit of {limit} bytes",
                    code="body_too_large",
                )
            )
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the response proper has not started (as aiohttp does)
        return None

    # --- generation ----------------------------------------------------------------------------

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "completions")

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "chat")

    async def _read_json(self, request: web.Request) -> tuple[Any, int]:
        """The parsed body and its size in bytes (decompressed)."""
        content_type = request.headers.get("Content-Type")
        if content_type is not None and not _is_json_type(request.content_type):
            raise ApiError(
                400,
                f"Content-Type: expected application/json, got {content_type[:64]!r}",
                param="Content-Type",
                code="invalid_content_type",
            )
        limit = self.config.max_body_bytes
        length = request.content_length
        if length is not None and length > limit:
            raise ApiError(
                413,
                f"request body of {length} bytes exceeds the limit of {limit} bytes",
                code="body_too_large",
            )
        timeout = self.config.body_timeout
        try:
            async with asyncio.timeout(timeout):
                raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise ApiError(
                413, f"request body exceeds the limit of {limit} bytes", code="body_too_large"
            ) from None
        except TimeoutError:
            # End the body here: aiohttp would otherwise linger up to 10 s more reading (and
            # dropping) the rest of it before it closes the connection, so a client that reads
            # the 408 until the close waited the timeout plus 10 s.
            request.content.feed_eof()
            raise ApiError(
                408,
                f"the request body did not arrive within {timeout:g} s "
                f"(Content-Length {length if length is not None else 'not sent'})",
                code="body_timeout",
            ) from None
        except _BAD_BODY as exc:
            encoding = request.headers.get("Content-Encoding")
            what = f" (Content-Encoding: {encoding[:32]})" if encoding else ""
            detail = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            raise ApiError(
                400, f"unreadable request body{what}: {str(detail)[:200]}", code="invalid_body"
            ) from None
        encoding = request.headers.get("Content-Encoding", "").strip().lower()
        if encoding and encoding != "identity":
            raw = _decompress(raw, encoding, limit)
        try:
            return orjson.loads(raw), len(raw)
        except orjson.JSONDecodeError as exc:
            raise ApiError(400, f"malformed JSON body: {exc}", code="invalid_json") from None

    async def _parse_off_loop(self, body: Any, size: int, endpoint: str) -> GenRequest:
        """`_parse`, in the tokenizing pool for a large body (OFFLOAD_BODY_BYTES) with text to
        encode. A prompt of token ids is parsed inline: without an encode the thread only runs
        Python, which waits for the GIL with the loop (measured: 2.1 ms median from read to
        parsed for 1024 ids at c=32, docs/fidelity.md "The closed loop's turnaround")."""
        if (size < OFFLOAD_BODY_BYTES or not self.tokenizer.releases_gil
                or not _has_text(body, endpoint)):
            return self._parse(body, endpoint)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(TOKENIZE_THREADS, thread_name_prefix="tokenize")
        return await asyncio.get_running_loop().run_in_executor(
            self._pool, self._parse, body, endpoint)

    def _parse(self, body: Any, endpoint: str) -> GenRequest:
        context = self.workers.context_length()
        if endpoint == "chat":
            req = parse_chat(body, self.tokenizer, context)
        else:
            req = parse_completion(body, self.tokenizer, DEFAULT_COMPLETIONS_MAX_TOKENS, context)
        if req.model != self.config.model_name and req.model not in self.workers.models():
            raise ApiError(
                404,
                f"model {req.model!r} does not exist; served: {', '.join(self.served_models())}",
                param="model",
                code="model_not_found",
            )
        return req

    async def _generate(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        trace = Trace(uuid.uuid4().hex, time.perf_counter_ns(), time.time() * 1000.0)
        metrics = self.metrics
        metrics.inflight += 1
        req: GenRequest | None = None
        try:
            try:
                body, size = await self._read_json(request)
                req = await self._parse_off_loop(body, size, endpoint)
            except ApiError as exc:
                trace.status = exc.status
                return _error(exc)
            if req.stream:
                return await self._stream(request, req, trace)
            return await self._unary(request, req, trace)
        except asyncio.CancelledError:
            trace.status = 499
            raise
        except Exception as exc:  # a bug: the client gets a 500 in the OpenAI shape, counted
            trace.status = 500
            trace.outcome = "internal_error"
            _internal_log.error(
                "internal error on %s (request %s): %s: %s",
                endpoint,
                trace.request_id,
                type(exc).__name__,
                exc,
                exc_info=exc,
            )
            return _error(ApiError(500, f"internal error ({type(exc).__name__})",
                                   code="internal_error"))
        finally:
            if not trace.end_ns:
                trace.end_ns = time.perf_counter_ns()
            metrics.inflight -= 1
            if trace.outcome == "success":
                trace.outcome = _outcome(trace.status)
            metrics.finished(endpoint, trace.outcome, trace.decode_worker_id, trace.tokens)
            self._log(endpoint, req, trace)

    @staticmethod
    def _log(endpoint: str, req: GenRequest | None, trace: Trace) -> None:
        if not log.isEnabledFor(logging.INFO):
            return
        ttft = (trace.first_token_ns - trace.received_ns) / 1e6 if trace.first_token_ns else -1.0
        log.info(
            "request id=%s endpoint=%s status=%d outcome=%s prefill_worker=%s decode_worker=%s "
            "prompt_tokens=%d completion_tokens=%d ttft_ms=%.2f total_ms=%.2f migrations=%d",
            trace.request_id,
            endpoint,
            trace.status,
            trace.outcome,
            trace.prefill_worker_id or "-",
            trace.decode_worker_id or "-",
            len(req.token_ids) if req else 0,
            trace.tokens,
            ttft,
            (trace.end_ns - trace.received_ns) / 1e6,
            trace.migrations,
        )

    async def _stream(
        self, request: web.Request, req: GenRequest, trace: Trace
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers=SSE_HEADERS)
        prefix = "chatcmpl-" if req.endpoint == "chat" else "cmpl-"
        response_id, created = prefix + trace.request_id, int(time.time())
        lp = Logprobs(req.endpoint == "chat", self.tokenizer) if req.logprobs else None
        decoder = self.tokenizer.stream_decoder()
        enc: StreamEncoder
        if self.think_end is not None and req.endpoint == "chat":
            enc = ReasoningEncoder(req, response_id, created, req.model)
            decoder = ReasoningDecoder(decoder, enc, self.think_end)
        else:
            enc = StreamEncoder(req, response_id, created, req.model)
        writer = SseWriter(request, resp, enc, decoder, lp, trace, self.metrics)
        try:
            await self.dispatcher.run(req, trace, writer)
            writer.stop()
            usage = usage_obj(req, trace) if req.include_usage else None
            await writer.finish(enc.finish(trace.finish or "stop", trace.stop_reason,
                                           nvext_obj(req, trace), usage))
        except ApiError as exc:
            writer.stop()
            trace.status = exc.status
            if not resp.prepared:
                return _error(exc)
            trace.outcome = _outcome(exc.status)
            trace.status = 200
            try:
                await resp.write_eof(exc.sse_bytes() + DONE)
            except _CLIENT_GONE:
                trace.outcome = "cancelled"
        except _CLIENT_GONE:
            trace.outcome = "cancelled"
            trace.status = 499
        except Exception as exc:
            if not resp.prepared:
                raise  # _generate answers 500
            writer.stop()
            trace.outcome = "internal_error"
            _internal_log.error(
                "internal error in a stream (request %s): %s: %s",
                trace.request_id,
                type(exc).__name__,
                exc,
                exc_info=exc,
            )
            err = ApiError(500, f"internal error ({type(exc).__name__})", code="internal_error")
            try:
                await resp.write_eof(err.sse_bytes() + DONE)
            except _CLIENT_GONE:
                pass
        return resp

    async def _unary(
        self, request: web.Request, req: GenRequest, trace: Trace
    ) -> web.StreamResponse:
        lp = Logprobs(req.endpoint == "chat", self.tokenizer) if req.logprobs else None
        writer = UnaryWriter(lp, trace, self.metrics)
        try:
            await self.dispatcher.run(req, trace, writer)
        except ApiError as exc:
            trace.status = exc.status
            return _error(exc)
        trace.end_ns = time.perf_counter_ns()
        prefix = "chatcmpl-" if req.endpoint == "chat" else "cmpl-"
        ids, reasoning = writer.ids, None
        if self.think_end is not None and req.endpoint == "chat":
            thought, ids = split_reasoning(ids, self.think_end)
            reasoning = self.tokenizer.decode(thought)
        body = full_response(
            req,
            prefix + trace.request_id,
            int(time.time()),
            req.model,
            self.tokenizer.decode(ids),
            trace.finish or "stop",
            trace.stop_reason,
            Logprobs.merge(writer.logprobs, req.endpoint == "chat") if lp is not None else None,
            usage_obj(req, trace),
            nvext_obj(req, trace),
            reasoning,
        )
        return web.Response(body=body, content_type="application/json")
