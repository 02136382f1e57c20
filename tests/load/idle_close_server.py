"""An HTTP/1.1 server that closes kept-alive connections after a short idle time, the way
uvicorn (vLLM's OpenAI server) does after `timeout_keep_alive` (5 s there), with the race made
deterministic: a request that arrives in the last `window_s` before the idle close is dropped
unanswered (it was on the wire when the server decided to close). A client that reuses a
connection at that boundary sees "server closed the connection before the response".

It answers every POST with a small SSE completion stream (chunked): two tokens and usage.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import orjson

EVENTS = (
    b'data: {"choices":[{"index":0,"text":"a","finish_reason":null}]}\n\n',
    b'data: {"choices":[{"index":0,"text":"b","finish_reason":"length"}]}\n\n',
    b'data: {"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":2,'
    b'"total_tokens":22}}\n\n',
    b"data: [DONE]\n\n",
)
HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\n\r\n")


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


RESPONSE = HEAD + b"".join(_chunk(e) for e in EVENTS) + b"0\r\n\r\n"


@dataclass
class IdleCloseServer:
    """Serve on 127.0.0.1 (`start`); `idle_s`: the keep-alive timeout; `window_s`: a request
    arriving that close to it is dropped with the connection. Counts what happened."""

    idle_s: float
    window_s: float
    keep_alive_header: bool = False  # send `Keep-Alive: timeout=N` (N = idle_s, rounded down)
    connections: int = 0
    answered: int = 0
    dropped: int = 0  # requests lost with a connection closed at the idle boundary
    idle_closes: int = 0
    _server: asyncio.Server | None = field(default=None, repr=False)

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        loop = asyncio.get_running_loop()
        head = HEAD
        if self.keep_alive_header:
            head = HEAD.replace(b"\r\n\r\n", b"\r\nkeep-alive: timeout=%d\r\n\r\n"
                                % int(self.idle_s))
        response = head + RESPONSE[len(HEAD):]
        first = True
        try:
            while True:
                idle_from = loop.time()
                try:
                    async with asyncio.timeout(None if first else self.idle_s):
                        line = await reader.readuntil(b"\r\n\r\n")
                except TimeoutError:
                    self.idle_closes += 1
                    return
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                if not first and loop.time() - idle_from >= self.idle_s - self.window_s:
                    self.dropped += 1  # arrived as the server was closing: lost
                    return
                first = False
                length = 0
                for h in line.split(b"\r\n"):
                    name, _, value = h.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                body = await reader.readexactly(length)
                orjson.loads(body)
                writer.write(response)
                await writer.drain()
                self.answered += 1
        finally:
            writer.close()
