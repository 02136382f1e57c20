"""A long prompt is tokenized off the frontend's event loop (lab/serve/frontend/app.py,
OFFLOAD_BODY_BYTES), when the tokenizer releases the GIL: other streams go on meanwhile."""

from __future__ import annotations

import asyncio
import threading

from lab.serve.frontend.app import OFFLOAD_BODY_BYTES
from lab.serve.frontend.server import FrontendServer, running
from lab.serve.tokenizer import WordTokenizer
from tests.serve.fakes import FakeFleet, FakeWorker, fleet_settings
from tests.serve.test_frontend_http import MODEL, post

#: the encode of the long prompt gives up waiting after this (the test then fails, not hangs)
HOLD_S = 20.0


class HeldTokenizer(WordTokenizer):
    """The word tokenizer, releasing the GIL as HF's does; a prompt starting with "held"
    encodes only once `release` is set, and says when it started in `entered`."""

    releases_gil = True

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def encode(self, text: str, limit: int | None = None) -> list[int]:
        if text.startswith("held"):
            self.entered.set()
            self.release.wait(HOLD_S)
        return super().encode(text, limit)


async def test_a_long_prompt_tokenizing_does_not_hold_other_requests() -> None:
    tok = HeldTokenizer()
    fleet = FakeFleet(FakeWorker("w0"))
    server = FrontendServer(fleet_settings(), registry=fleet, client_factory=fleet.client_factory,
                            tokenizer=tok)
    long_prompt = "held " + "word " * (OFFLOAD_BODY_BYTES // 5)
    async with running(server) as url:
        await server.workers.synced.wait()
        held = asyncio.create_task(post(url, "/v1/completions", {
            "model": MODEL, "prompt": long_prompt, "max_tokens": 3}))
        await asyncio.to_thread(tok.entered.wait, HOLD_S)
        assert tok.entered.is_set()
        # the long prompt's encode is now blocked in a thread; a short request must be served
        status, body = await asyncio.wait_for(post(url, "/v1/completions", {
            "model": MODEL, "prompt": "short prompt", "max_tokens": 3}), HOLD_S / 2)
        assert status == 200, body
        assert not held.done(), "the long prompt finished before it was released"
        tok.release.set()
        status, body = await held
        assert status == 200, body
    assert not [t for t in threading.enumerate() if t.name.startswith("tokenize")], \
        "the tokenizing threads outlived the frontend"


async def test_a_long_token_id_prompt_is_parsed_on_the_loop() -> None:
    """Token ids have no encode: a thread would only run Python, waiting for the GIL with the
    loop, so such a prompt is parsed inline and the tokenizing pool is never started."""
    tok = HeldTokenizer()
    fleet = FakeFleet(FakeWorker("w0"))
    server = FrontendServer(fleet_settings(), registry=fleet, client_factory=fleet.client_factory,
                            tokenizer=tok)
    ids = list(range(1000, 1000 + OFFLOAD_BODY_BYTES // 4))  # a body well over the threshold
    async with running(server) as url:
        await server.workers.synced.wait()
        status, body = await post(url, "/v1/completions", {
            "model": MODEL, "prompt": ids, "max_tokens": 3})
        assert status == 200, body
        started = [t.name for t in threading.enumerate() if t.name.startswith("tokenize")]
        assert not started, f"a token-id prompt was parsed in the tokenizing pool: {started}"
