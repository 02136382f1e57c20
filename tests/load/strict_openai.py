"""A fake OpenAI server that behaves like real ones (vLLM, SGLang, trtllm-serve, Dynamo) where
they differ from the lab's frontend:

- it refuses token-id prompts (400 with an error message);
- it rejects `stream_options` (400 with a message), and never puts usage in a stream;
- it counts prompt tokens with a real tokenizer.json (non-streaming usage), and a chat request
  through a chat template that adds CHAT_TEMPLATE_OVERHEAD-ish tokens around the content;
- /v1/models lists its one model (unless --no-models: 404).

Options for the failure tests: `--fail-after N` (503 for every request after the first N),
`--no-stream` (answers a streaming request with a plain JSON body), `--token-ids-ok`, and
`--stream-usage` (accepts `stream_options.include_usage` and sends usage, as vLLM does), and
`--refuse-min-tokens` (400 in Dynamo's error shape for any non-zero `min_tokens`).

Run it as a process: `python -m tests.load.strict_openai --port 0 --tokenizer DIR` (prints a
ready line naming its address). It records every request's prompt token count in memory and
serves them at GET /debug/prompt_tokens (for the tests' assertions).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import orjson
from aiohttp import web

from lab.shared.hf_tokenizer import load_hf
from tests.load.fake_http import FakeServer, serve_forever

TEMPLATE = "<|user|>\n{content}\n<|assistant|>\n"


def _error(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}},
                             status=status)


@dataclass(eq=False)
class StrictOpenAI(FakeServer):
    tokenizer: str
    model: str = field(default="strict-model", kw_only=True)
    fail_after: int | None = field(default=None, kw_only=True)
    stream: bool = field(default=True, kw_only=True)
    token_ids_ok: bool = field(default=False, kw_only=True)
    stream_usage: bool = field(default=False, kw_only=True)
    refuse_min_tokens: bool = field(default=False, kw_only=True)
    seen: int = field(default=0, init=False)
    #: every request's prompt token count, in order (served at GET /debug/prompt_tokens)
    prompt_tokens: list[int] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.tok = load_hf(self.tokenizer)
        self.app.router.add_post("/v1/completions", self.completions)
        self.app.router.add_post("/v1/chat/completions", self.chat)
        self.app.router.add_get("/debug/prompt_tokens", self.debug)

    def count(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=False).ids)

    async def debug(self, request: web.Request) -> web.Response:
        return web.json_response(self.prompt_tokens)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            if not self.token_ids_ok:
                return _error(400, "prompt must be a string: token-id prompts are not supported")
            n = len(prompt)
        elif isinstance(prompt, str):
            n = self.count(prompt)
        else:
            return _error(400, "prompt is required")
        return await self._generate(request, body, n, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        messages = body.get("messages") or []
        text = "".join(TEMPLATE.format(content=m.get("content", "")) for m in messages)
        return await self._generate(request, body, self.count(text), chat=True)

    async def _generate(self, request: web.Request, body: dict, n_prompt: int,
                        chat: bool) -> web.StreamResponse:
        if body.get("model") != self.model:
            return _error(404, f"The model `{body.get('model')}` does not exist.",
                          "NotFoundError")
        if self.refuse_min_tokens and body.get("min_tokens"):
            return web.json_response(  # Dynamo's error shape: {message, type, code}
                {"message": f"min_tokens {body['min_tokens']} refused", "type": "Bad Request",
                 "code": 400}, status=400)
        if "stream_options" in body and not self.stream_usage:
            return _error(400, "Unrecognized request argument supplied: stream_options")
        self.seen += 1
        if self.fail_after is not None and self.seen > self.fail_after:
            return _error(503, "the engine is overloaded", "service_unavailable")
        self.prompt_tokens.append(n_prompt)
        n = int(body.get("max_tokens") or 16)
        ids = [(7 * i + 11) % self.tok.get_vocab_size() for i in range(n)]
        pieces = [self.tok.decode([i]) or "x" for i in ids]
        obj = "chat.completion.chunk" if chat else "text_completion"
        usage = {"prompt_tokens": n_prompt, "completion_tokens": n,
                 "total_tokens": n_prompt + n}
        if not body.get("stream") or not self.stream:
            text = "".join(pieces)
            choice = ({"index": 0, "message": {"role": "assistant", "content": text},
                       "finish_reason": "length"} if chat else
                      {"index": 0, "text": text, "finish_reason": "length"})
            return web.json_response({"id": "x", "object": obj, "model": self.model,
                                      "choices": [choice], "usage": usage})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for k, piece in enumerate(pieces):
            last = k == n - 1
            choice = ({"index": 0, "delta": {"content": piece}} if chat
                      else {"index": 0, "text": piece})
            choice["finish_reason"] = "length" if last else None
            await resp.write(b"data: " + orjson.dumps(
                {"id": "x", "object": obj, "model": self.model, "choices": [choice]}) + b"\n\n")
        if (body.get("stream_options") or {}).get("include_usage"):
            await resp.write(b"data: " + orjson.dumps(
                {"id": "x", "object": obj, "model": self.model, "choices": [],
                 "usage": usage}) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--model", default="strict-model")
    ap.add_argument("--no-models", action="store_true")
    ap.add_argument("--no-stream", action="store_true")
    ap.add_argument("--token-ids-ok", action="store_true")
    ap.add_argument("--fail-after", type=int, default=None)
    ap.add_argument("--stream-usage", action="store_true")
    ap.add_argument("--refuse-min-tokens", action="store_true")
    args = ap.parse_args()
    serve_forever(lambda: StrictOpenAI(args.tokenizer, model=args.model,
                                       models_endpoint=not args.no_models,
                                       fail_after=args.fail_after, stream=not args.no_stream,
                                       token_ids_ok=args.token_ids_ok,
                                       stream_usage=args.stream_usage,
                                       refuse_min_tokens=args.refuse_min_tokens),
                  args.port, "strict")


if __name__ == "__main__":
    main()
