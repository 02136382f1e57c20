"""Hostile input against the frontend, over real sockets (raw HTTP bytes): every malformed request
gets a clear 4xx (never a 500 or a traceback), a prompt beyond the workers' context is refused
before dispatch, and the server bounds idle connections, slow bodies and connection counts."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import logging
import time
import zlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from lab.serve.frontend.server import FrontendServer, running
from tests.serve.fakes import FakeFleet, FakeWorker, fleet_settings

MODEL = "mocker-model"
CONTEXT = 64
BIG = 18446744073709551616  # 2**64


@contextlib.asynccontextmanager
async def frontend(fleet: FakeFleet, **options: Any) -> AsyncIterator[tuple[str, int]]:
    server = FrontendServer(fleet_settings(**options), registry=fleet,
                            client_factory=fleet.client_factory)
    async with running(server) as url:
        await server.workers.synced.wait()
        host, _, port = url.removeprefix("http://").rpartition(":")
        yield host, int(port)


async def exchange(addr: tuple[str, int], data: bytes, timeout: float = 10.0) -> bytes:
    """Send raw bytes, read until the server closes or `timeout`."""
    reader, writer = await asyncio.open_connection(*addr)
    try:
        writer.write(data)
        await writer.drain()
        out = b""
        with contextlib.suppress(TimeoutError, ConnectionError):
            async with asyncio.timeout(timeout):
                while chunk := await reader.read(65536):
                    out += chunk
                    if _complete(out):
                        break
        return out
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def _complete(data: bytes) -> bool:
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep or head.startswith(b"HTTP/1.1 100"):
        return False
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def status_of(response: bytes) -> int:
    assert response.startswith(b"HTTP/1."), response[:200]
    return int(response.split(b" ", 2)[1])


def post(path: str, body: bytes, *headers: str, length: int | None = None) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: lab", "Content-Type: application/json",
             f"Content-Length: {len(body) if length is None else length}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def js(obj: Any) -> bytes:
    return json.dumps(obj).encode()  # the stdlib writes integers of any size (orjson cannot)


def completion(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 4, **extra}


def chat(content: Any, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}


C, CHAT = "/v1/completions", "/v1/chat/completions"

# (name, raw request, expected status, text the body must contain)
CASES: list[tuple[str, bytes, int, str]] = [
    # HTTP framing (aiohttp's parser)
    ("garbage request line", b"GARBAGE\r\n\r\n", 400, ""),
    ("header without colon", b"POST /v1/completions HTTP/1.1\r\nHost lab\r\n\r\n", 400, ""),
    ("negative content-length", post(C, b"{}", length=-1), 400, ""),
    ("non-numeric content-length", post(C, b"{}").replace(b"Length: 2", b"Length: 2x"), 400, ""),
    ("CL and chunked", post(C, b"{}", "Transfer-Encoding: chunked"), 400, ""),
    ("bad chunk size",
     b"POST /v1/completions HTTP/1.1\r\nHost: lab\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
     400, ""),
    ("header line too long", b"GET /live HTTP/1.1\r\nX: " + b"a" * 20000 + b"\r\n\r\n", 400,
     "8190"),
    ("unsupported version", b"GET /live HTTP/9.9\r\nHost: lab\r\n\r\n", 400, "version"),
    ("GET on a POST route", b"GET /v1/completions HTTP/1.1\r\nHost: lab\r\n\r\n", 405, ""),
    ("unknown path", post("/v1/nothing", b"{}"), 404, ""),
    # bodies
    ("empty body", post(C, b""), 400, "malformed JSON"),
    ("invalid JSON", post(C, b"{not json"), 400, "malformed JSON"),
    ("JSON array", post(C, b"[1,2]"), 400, "JSON object"),
    ("NaN literal", post(C, b'{"model":"m","prompt":"a","temperature":NaN}'), 400, "JSON"),
    ("huge float", post(C, b'{"model":"m","prompt":"a","temperature":1e400}'), 400, ""),
    ("corrupt gzip", post(C, b"\x1f\x8b\x08\x00garbage-not-deflate", "Content-Encoding: gzip"),
     400, "unreadable request body"),
    ("truncated gzip", post(C, gzip.compress(js(completion()))[:20], "Content-Encoding: gzip"),
     400, "truncated"),
    ("gzip bomb", post(C, gzip.compress(b" " * (2 << 20)), "Content-Encoding: gzip"), 413,
     "once decompressed"),
    ("unknown encoding", post(C, b"{}", "Content-Encoding: br"), 415, "Content-Encoding"),
    ("oversized Content-Length", post(C, b"", length=10**9), 413, "exceeds the limit"),
    ("Expect 100-continue, oversized",
     post(C, b"", "Expect: 100-continue", length=10**9), 413, "exceeds the limit"),
    ("unknown Expect", post(C, js(completion()), "Expect: magic"), 417, "Expect"),
    # fields
    ("model missing", post(C, js({"prompt": "a"})), 400, "model"),
    ("unknown model", post(C, js(completion(model="nope"))), 404, "does not exist"),
    ("prompt missing", post(C, js({"model": MODEL})), 400, "prompt"),
    ("prompt a number", post(C, js(completion(prompt=5))), 400, "prompt"),
    ("prompt empty", post(C, js(completion(prompt=""))), 400, "prompt"),
    ("token id 2**64 in an array", post(C, js(completion(prompt=[1, BIG]))), 400, "prompt"),
    ("token id 2**32", post(C, js(completion(prompt=[2**32]))), 400, "prompt"),
    ("negative token id", post(C, js(completion(prompt=[-1]))), 400, "prompt"),
    ("<token:2**64> in text", post(C, js(completion(prompt=f"a <token:{BIG}>"))), 400,
     "prompt"),
    ("<token:2**64> in chat", post(CHAT, js(chat(f"<token:{BIG}>"))), 400, "messages"),
    ("<token:2**64> as stop", post(C, js(completion(stop=f"<token:{BIG}>"))), 400, "stop"),
    ("stop_token_ids 2**64", post(C, js(completion(stop_token_ids=[BIG]))), 400,
     "stop_token_ids"),
    ("max_tokens 2**64", post(C, js(completion(max_tokens=BIG))), 400, "max_tokens"),
    ("max_tokens 10**4000", post(C, js(completion(max_tokens=10**4000))), 400, ""),
    ("min_tokens 2**64", post(C, js(completion(min_tokens=BIG, max_tokens=None))), 400,
     "min_tokens"),
    ("seed 2**64", post(C, js(completion(seed=BIG))), 400, "seed"),
    ("top_k 2**64", post(C, js(completion(top_k=BIG))), 400, "top_k"),
    ("max_tokens a string", post(C, js(completion(max_tokens="5"))), 400, "max_tokens"),
    ("temperature 3", post(C, js(completion(temperature=3))), 400, "temperature"),
    ("n=2", post(C, js(completion(n=2))), 400, "n"),
    ("stream a string", post(C, js(completion(stream="yes"))), 400, "stream"),
    ("messages not a list", post(CHAT, js({"model": MODEL, "messages": "hi"})), 400,
     "messages"),
    ("message not an object", post(CHAT, js({"model": MODEL, "messages": [1]})), 400,
     "messages[0]"),
    ("image content", post(CHAT, js(chat([{"type": "image_url"}]))), 400, "messages[0]"),
    ("message without content",
     post(CHAT, js({"model": MODEL, "messages": [{"role": "user"}]})), 400,
     "messages[0].content: required for role 'user'"),
    ("message with null content", post(CHAT, js(chat(None))), 400, "messages[0].content"),
    ("unknown role", post(CHAT, js({"model": MODEL, "messages": [
        {"role": "wizard", "content": "hi"}]})), 400, "messages[0].role: 'wizard' is not one"),
    ("Content-Type text/plain", post(C, js(completion())).replace(
        b"Content-Type: application/json", b"Content-Type: text/plain"), 400,
     "Content-Type: expected application/json, got 'text/plain'"),
    ("stop of two words", post(C, js(completion(stop="two words"))), 400, "stop"),
    ("nvext not an object", post(C, js(completion(nvext=[]))), 400, "nvext"),
    # the context (64 tokens here, from discovery): refused before dispatch
    ("token prompt beyond the context", post(C, js(completion(prompt=list(range(CONTEXT))))),
     400, "context length is 64"),
    ("text prompt beyond the context", post(C, js(completion(prompt="x " * 5000))), 400,
     "more than 63 tokens"),
    ("chat beyond the context", post(CHAT, js(chat("x " * 5000))), 400, "context length"),
]


async def test_malformed_requests_get_a_clear_4xx(caplog: pytest.LogCaptureFixture) -> None:
    worker = FakeWorker("w0", context_length=CONTEXT)
    fleet = FakeFleet(worker)
    caplog.set_level(logging.INFO)
    async with frontend(fleet, max_body_bytes=1 << 20) as addr:
        failures = []
        for name, raw, want, text in CASES:
            response = await exchange(addr, raw)
            got = status_of(response) if response else None
            if name.startswith("Expect 100"):
                assert b"100 Continue" not in response, "413 must come before 100 Continue"
            if got != want or text.encode() not in response:
                failures.append(f"{name}: got {got}, want {want} {text!r}: {response[:300]!r}")
        assert not failures, "\n".join(failures)
        # Nothing malformed reached a worker; a well-formed request still works.
        assert worker.requests == []
        ok = await exchange(addr, post(C, js(completion())))
        assert status_of(ok) == 200
        zipped = gzip.compress(js(completion()))
        ok = await exchange(addr, post(C, zipped, "Content-Encoding: gzip"))
        assert status_of(ok) == 200  # a valid gzip body is still read
        deflated = zlib.compress(js(completion()))
        ok = await exchange(addr, post(C, deflated, "Content-Encoding: deflate"))
        assert status_of(ok) == 200
    assert "Traceback" not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


async def test_a_prompt_beyond_the_context_costs_the_limit_not_the_body() -> None:
    """A 10 MB prompt of "x " (5M words) against a 64-token context: the 400 comes back fast
    and names the limit (the tokenizer stops after the limit)."""
    fleet = FakeFleet(FakeWorker("w0", context_length=CONTEXT))
    async with frontend(fleet) as addr:
        body = js(completion(prompt="x " * 5_000_000))
        started = time.perf_counter()
        response = await exchange(addr, post(C, body), timeout=30)
        elapsed = time.perf_counter() - started
    assert status_of(response) == 400 and b"context_length_exceeded" in response
    assert b"10000000 characters" in response
    assert elapsed < 5.0, elapsed  # JSON parsing only; 5M tokens would take far longer


async def test_malformed_http_is_one_warning_line_and_cannot_flood_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fleet = FakeFleet(FakeWorker("w0"))
    caplog.set_level(logging.DEBUG, logger="aiohttp.server")
    async with frontend(fleet) as addr:
        for _ in range(60):
            assert status_of(await exchange(addr, b"GARBAGE\r\n\r\n")) == 400
    lines = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert lines and all(r.levelno == logging.WARNING and r.exc_info is None for r in lines)
    assert "bad HTTP request" in lines[0].getMessage()
    assert len(lines) <= 20, len(lines)  # rate-limited: a client cannot flood the log
    assert "Traceback" not in caplog.text


async def test_a_content_length_lie_gets_408_and_the_connection_closes() -> None:
    fleet = FakeFleet(FakeWorker("w0"))
    async with frontend(fleet, body_timeout=0.5) as addr:
        started = time.monotonic()
        response = await exchange(addr, post(C, b'{"model"', length=1000), timeout=15)
        assert status_of(response) == 408 and b"did not arrive within 0.5 s" in response
        assert b"Connection: close" in response or b"connection: close" in response.lower()
        assert time.monotonic() - started < 10


async def test_the_connection_closes_when_the_body_timeout_says() -> None:
    """The close follows the 408 at once: no extra lingering read of a body that never comes
    (aiohttp's default would keep the socket 10 s longer)."""
    fleet = FakeFleet(FakeWorker("w0"))
    async with frontend(fleet, body_timeout=0.5) as addr:
        reader, writer = await asyncio.open_connection(*addr)
        writer.write(post(C, b'{"model"', length=1000))
        started = time.monotonic()
        async with asyncio.timeout(30):
            data = await reader.read()  # until the server closes
        closed_after = time.monotonic() - started
        writer.close()
        assert status_of(data) == 408
        assert closed_after < 5.0, f"closed {closed_after:.1f} s after a 0.5 s body timeout"


async def test_idle_and_slowloris_connections_are_closed() -> None:
    fleet = FakeFleet(FakeWorker("w0"))
    async with frontend(fleet, idle_timeout=0.5) as addr:
        for opening in (b"", b"POST /v1/completions HTTP/1.1\r\nHost: lab\r\nX-Slow: "):
            reader, writer = await asyncio.open_connection(*addr)
            writer.write(opening)
            started = time.monotonic()
            async with asyncio.timeout(15):
                data = await reader.read()  # EOF: the server closed it
            assert data == b"" or data.startswith(b"HTTP/1.1 4")
            assert time.monotonic() - started < 10
            writer.close()


async def test_the_connection_cap_refuses_with_503() -> None:
    fleet = FakeFleet(FakeWorker("w0"))
    async with frontend(fleet, max_connections=5) as addr:
        held = [await asyncio.open_connection(*addr) for _ in range(5)]
        try:
            await asyncio.sleep(0.1)
            refused = await exchange(addr, b"GET /live HTTP/1.1\r\nHost: lab\r\n\r\n")
            assert status_of(refused) == 503 and b"too many connections" in refused
        finally:
            for _, writer in held:
                writer.close()
        # Once the held connections are gone, new ones are served again.
        async with asyncio.timeout(10):
            while True:
                response = await exchange(addr, b"GET /live HTTP/1.1\r\nHost: lab\r\n\r\n")
                if status_of(response) == 200:
                    break
                await asyncio.sleep(0.05)


async def test_an_internal_error_is_a_counted_500_not_a_success() -> None:
    async def broken(worker: FakeWorker, req: dict[str, Any]):
        raise RuntimeError("bug in a worker client")
        yield  # pragma: no cover

    fleet = FakeFleet(FakeWorker("w0", behavior=broken))
    async with frontend(fleet) as addr:
        for stream in (False, True):
            response = await exchange(addr, post(C, js(completion(stream=stream))))
            assert status_of(response) == 500 and b"internal_error" in response
        metrics = await exchange(addr, b"GET /metrics HTTP/1.1\r\nHost: lab\r\n\r\n")
    lines = [ln for ln in metrics.decode().splitlines() if "requests_total{" in ln]
    assert any('outcome="internal_error"' in ln for ln in lines), lines
    assert not any('outcome="success"' in ln for ln in lines), lines
