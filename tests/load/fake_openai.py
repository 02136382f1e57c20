"""A small fake OpenAI streaming server (aiohttp) for client and sweep tests.

It streams `max_tokens` tokens as SSE, one chunk per `tokens_per_chunk` tokens, with a role-only
first chunk and a usage-only last chunk (neither is a token), records the peak number of requests
in flight, and fails on demand:
- prompt[0] == FAIL_HTTP -> 503 with an OpenAI error body
- prompt[0] == FAIL_STREAM -> an error event after two tokens
- prompt[0] == FAIL_CUT -> the connection is dropped mid-stream
- prompt[0] == FAIL_SHAPE -> a well-formed event of the wrong shape (`"choices": "x"`)
It can also be run as a process: `python -m tests.load.fake_openai --port 0` (prints a ready line).
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass, field

import orjson
from aiohttp import web

from tests.load.fake_http import FakeServer, serve_forever

FAIL_HTTP = 7
FAIL_STREAM = 8
FAIL_CUT = 9
FAIL_SHAPE = 10
SHAPE_EVENTS = (b'{"choices":"x"}', b'{"choices":[1]}', b'{"choices":[{"delta":"x"}]}',
                b'{"usage":"many"}', b'{"usage":{"completion_tokens":"ten"}}',
                b'{"choices":[],"nvext":5}')


@dataclass(kw_only=True, eq=False)
class FakeOpenAI(FakeServer):
    model: str = "fake-model"
    token_delay_s: float = 0.0
    ttft_s: float = 0.0
    tokens_per_chunk: int = 1
    worker: str = "fake-worker"
    in_flight: int = field(default=0, init=False)
    peak: int = field(default=0, init=False)
    served: int = field(default=0, init=False)
    #: the client (host, port) of every request: counts connections
    peers: set = field(default_factory=set, init=False)
    #: the client (host, port) of each request, in arrival order: which connection served it
    peer_order: list = field(default_factory=list, init=False)
    #: the prompt of each request, in arrival order
    prompts: list = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.app.router.add_post("/v1/completions", self.completions)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        if request.transport is not None:
            self.peers.add(request.transport.get_extra_info("peername"))
            self.peer_order.append(request.transport.get_extra_info("peername"))
        prompt = body["prompt"]
        self.prompts.append(prompt)
        first = prompt[0] if isinstance(prompt, list) else None
        n_prompt = len(prompt) if isinstance(prompt, list) else len(prompt.split())
        if body.get("model") != self.model:
            return web.json_response(
                {"error": {"message": f"model {body.get('model')!r} not found",
                           "type": "not_found"}},
                status=404)
        if first == FAIL_HTTP:
            return web.json_response(
                {"error": {"message": "no worker", "type": "service_unavailable"}}, status=503)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            n = int(body.get("max_tokens") or 16)
            rid = "cmpl-" + request.headers.get("X-Request-Id", "x")

            def chunk(text: str, finish: str | None = None, **extra: object) -> bytes:
                obj = {"id": rid, "object": "text_completion", "model": self.model,
                       "choices": [{"index": 0, "text": text, "finish_reason": finish}], **extra}
                return b"data: " + orjson.dumps(obj) + b"\n\n"

            await resp.write(chunk(""))  # role-only / empty chunk: not a token
            if self.ttft_s:
                await asyncio.sleep(self.ttft_s)
            sent = 0
            while sent < n:
                k = min(self.tokens_per_chunk, n - sent)
                if first == FAIL_STREAM and sent >= 2:
                    await resp.write(b"event: error\ndata: " + orjson.dumps(
                        {"error": {"message": "engine died", "type": "engine_error"}}) + b"\n\n")
                    return resp
                if first == FAIL_SHAPE and sent >= 2:
                    shape = SHAPE_EVENTS[prompt[1] % len(SHAPE_EVENTS)]
                    await resp.write(b"data: " + shape + b"\n\ndata: [DONE]\n\n")
                    return resp
                if first == FAIL_CUT and sent >= 2:
                    assert request.transport is not None
                    request.transport.close()
                    return resp
                sent += k
                last = sent >= n
                wid = {"prefill_worker_id": None, "decode_worker_id": self.worker}
                extra = {"nvext": {"worker_id": wid}} if last else {}
                await resp.write(chunk(" ".join(f"<token:{1000 + j}>" for j in range(k)) + " ",
                                       "length" if last else None, **extra))
                if self.token_delay_s and not last:
                    await asyncio.sleep(self.token_delay_s)
            usage = {"prompt_tokens": n_prompt, "completion_tokens": n,
                     "total_tokens": n_prompt + n,
                     "prompt_tokens_details": {"cached_tokens": 0}}
            await resp.write(b"data: " + orjson.dumps(
                {"id": rid, "object": "text_completion", "choices": [], "usage": usage}) + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            self.served += 1
            return resp
        finally:
            self.in_flight -= 1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--token-delay-ms", type=float, default=0.0)
    ap.add_argument("--model", default="fake-model")
    args = ap.parse_args()
    serve_forever(lambda: FakeOpenAI(token_delay_s=args.token_delay_ms / 1000, model=args.model),
                  args.port, "fake")


if __name__ == "__main__":
    main()
