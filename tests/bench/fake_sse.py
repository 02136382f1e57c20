"""A fast fake OpenAI streaming server: one SSE chunk per token, as fast as the loop can go.

It exists to measure the load client (`python -m tests.bench.load_bench`), so it must cost as
little as possible and stream the worst case for a client: every token is its own HTTP chunk and
its own socket write, and the writes of all open streams are interleaved (each stream writes one
chunk per event-loop iteration), so a client sees many small reads, like against a server that sends
one chunk per token (the reference Dynamo frontend does).

A raw asyncio.Protocol HTTP/1.1 server (keep-alive, chunked responses); every response frame is
pre-encoded. The request body's `max_tokens` (default 128), `stream` and prompt length are
honoured; everything else is ignored. Non-streaming requests get one JSON body.
With `--token-interval-ms` (about 1 ms or more) each token arrives in its own client read: the
worst case per token; without it, a client slower than this server gets several per read.

    python -m tests.bench.fake_sse --listen 127.0.0.1:0      # logs `ready role=fake-sse ...`
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable

import click
import orjson

from lab.wire.ready import format_ready

log = logging.getLogger("tests.bench.fake_sse")

MAX_HEAD = 64 * 1024
RESPONSE_ID = "cmpl-fake"
TOKEN_TEXT = "<token:1000> "


def _chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk (size line, data, CRLF)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj: dict) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _choice(text: str, finish: str | None) -> dict:
    return {"id": RESPONSE_ID, "object": "text_completion", "model": "fake",
            "choices": [{"index": 0, "text": text, "finish_reason": finish}]}


_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
         b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")
_ROLE = _chunk(_event(_choice("", None)))  # an empty first chunk: not a token
_TOKEN = _chunk(_event(_choice(TOKEN_TEXT, None)))
_LAST = _chunk(_event({**_choice(TOKEN_TEXT, "length"),
                       "nvext": {"worker_id": {"prefill_worker_id": None,
                                               "decode_worker_id": "fake-sse"}}}))
_DONE = _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


def _usage_chunk(prompt: int, completion: int) -> bytes:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion,
             "total_tokens": prompt + completion, "prompt_tokens_details": {"cached_tokens": 0}}
    return _chunk(_event({"id": RESPONSE_ID, "object": "text_completion", "choices": [],
                          "usage": usage}))


def _json_response(status: int, reason: str, obj: dict) -> bytes:
    body = orjson.dumps(obj)
    return (b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (status, reason.encode(), len(body), body))


class _Stream:
    """One streaming response: writes one token chunk per loop iteration (call_soon chain)."""

    __slots__ = ("conn", "interval_s", "left", "loop", "tail")

    def __init__(self, conn: _Conn, n: int, prompt: int) -> None:
        self.conn = conn
        self.left = n
        self.loop = conn.loop
        self.interval_s = conn.interval_s
        self.tail = _usage_chunk(prompt, n) + _DONE

    def start(self) -> None:
        self.conn.transport.write(_HEAD + _ROLE)  # type: ignore[union-attr]
        self._again()

    def _again(self) -> None:
        if self.interval_s:
            self.loop.call_later(self.interval_s, self.step)
        else:
            self.loop.call_soon(self.step)

    def step(self) -> None:
        conn = self.conn
        if conn.transport is None or conn.transport.is_closing():
            return
        self.left -= 1
        if self.left > 0:
            conn.transport.write(_TOKEN)
            self._again()
            return
        conn.transport.write(_LAST + self.tail if self.left == 0 else self.tail)
        conn.finished()


class _Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; requests are served one after another."""

    def __init__(self, loop: asyncio.AbstractEventLoop, interval_s: float) -> None:
        self.loop = loop
        self.interval_s = interval_s
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.busy = False
        self.close_after = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.busy:
            self._next()

    def _next(self) -> None:
        buf = self.buf
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEAD:
                self._fail(431, "Request Header Fields Too Large")
            return
        head = buf[:end].decode("latin-1").split("\r\n")
        headers = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0") or 0)
        if len(buf) < end + 4 + length:
            return
        body = buf[end + 4:end + 4 + length]
        self.buf = buf[end + 4 + length:]
        self.close_after = headers.get("connection", "").lower() == "close"
        self.busy = True
        try:
            req = orjson.loads(body) if body else {}
        except orjson.JSONDecodeError:
            self._fail(400, "Bad Request")
            return
        prompt = req.get("prompt")
        n_prompt = len(prompt) if isinstance(prompt, list) else len(str(prompt or "").split())
        n = max(1, int(req.get("max_tokens") or 128))
        if req.get("stream"):
            _Stream(self, n, n_prompt).start()
            return
        obj = {**_choice(TOKEN_TEXT * n, "length"),
               "usage": {"prompt_tokens": n_prompt, "completion_tokens": n,
                         "total_tokens": n_prompt + n}}
        self.transport.write(_json_response(200, "OK", obj))  # type: ignore[union-attr]
        self.finished()

    def _fail(self, status: int, reason: str) -> None:
        err = {"error": {"message": reason, "type": "invalid_request_error"}}
        if self.transport is not None:
            self.transport.write(_json_response(status, reason, err))
            self.transport.close()

    def finished(self) -> None:
        self.busy = False
        if self.close_after:
            if self.transport is not None:
                self.transport.close()
            return
        if self.buf:
            self._next()


async def serve(host: str, port: int, stop: asyncio.Event, interval_s: float = 0.0,
                on_ready: Callable[[str], None] | None = None) -> None:
    """Serve until `stop` is set; `on_ready` gets the bound "host:port"."""
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Conn(loop, interval_s), host, port)
    bound = server.sockets[0].getsockname()
    listen = f"{bound[0]}:{bound[1]}"
    log.info(format_ready("fake-sse", "fake-sse", listen))
    if on_ready is not None:
        on_ready(listen)
    async with server:
        await stop.wait()


@click.command()
@click.option("--listen", default="127.0.0.1:0", show_default=True, metavar="HOST:PORT",
              help="Address to listen on (port 0: any free port; see the ready line).")
@click.option("--token-interval-ms", type=click.FloatRange(min=0), default=0.0,
              show_default=True,
              help="Time between a stream's tokens; 0: one token per loop iteration (as fast as "
              "possible). About 1 ms or more makes every token its own read on the client.")
def main(listen: str, token_interval_ms: float) -> None:
    """Serve a fake OpenAI /v1/completions that streams one SSE chunk per token."""
    import uvloop

    host, _, port_s = listen.rpartition(":")
    try:
        port = int(port_s)
    except ValueError as exc:
        raise click.BadParameter(f"expected HOST:PORT, got {listen!r}", param_hint="--listen") \
            from exc
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(host or "127.0.0.1", port, stop, token_interval_ms / 1000)

    uvloop.run(run())


if __name__ == "__main__":
    main()
