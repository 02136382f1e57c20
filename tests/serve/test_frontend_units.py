"""Units of the frontend: tokenizers, routers, request parsing, SSE encoding, metrics."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from lab.serve.frontend.encode import StreamEncoder
from lab.serve.frontend.errors import ApiError
from lab.serve.frontend.metrics import FrontendMetrics
from lab.serve.frontend.protocol import parse_chat, parse_completion
from lab.serve.frontend.trace import Trace
from lab.serve.router import make_router, published_load
from lab.serve.tokenizer import HFTokenizer, WordTokenizer, load_tokenizer, word_token_id

# --- word tokenizer ----------------------------------------------------------------------------


def test_word_tokenizer_one_token_per_word_and_deterministic() -> None:
    tok = WordTokenizer()
    text = "the quick  brown\tfox\njumps"
    ids = tok.encode(text)
    assert len(ids) == 5
    assert ids == WordTokenizer().encode(text)  # same in a fresh instance / process
    assert all(1000 <= i < 32000 for i in ids)
    assert tok.encode("<token:7> x <token:31999>")[0::2] == [7, 31999]
    assert tok.encode("<token:x>") == [word_token_id("<token:x>")]
    assert tok.encode("   ") == []


def test_word_tokenizer_decode_n_tokens_gives_n_words_and_round_trips() -> None:
    tok = WordTokenizer()
    ids = [5, 123456, 0, 5]
    text = tok.decode(ids)
    assert text == "<token:5> <token:123456> <token:0> <token:5> "
    assert tok.encode(text) == ids
    # chunk texts concatenate to the text of the whole
    assert tok.decode(ids[:2]) + tok.decode(ids[2:]) == text


def test_word_tokenizer_stop_strings() -> None:
    tok = WordTokenizer()
    assert tok.stop_token_id("END") == word_token_id("END")
    assert tok.stop_token_id("<token:2>") == 2
    assert tok.stop_token_id("two words") is None
    assert tok.stop_token_id(" padded") is None
    assert tok.stop_token_id("") is None


def test_hf_tokenizer_json(tmp_path: Path) -> None:
    import tokenizers  # a runtime dependency: never skipped
    from tokenizers import models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "stop": 3}
    hf = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    hf.save(str(path))
    for where in (path, tmp_path):  # the file, or the directory holding it
        tok = load_tokenizer(where)
        assert isinstance(tok, HFTokenizer)
        assert tok.encode("hello world zebra") == [1, 2, 0]
        assert tok.decode([1, 2]).split() == ["hello", "world"]
        assert tok.stop_token_id("stop") == 3
        assert tok.stop_token_id("hello world") is None
    with pytest.raises(ValueError, match=r"no tokenizer\.json"):
        load_tokenizer(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"not": "a tokenizer"}))
    with pytest.raises(ValueError, match="cannot load"):
        load_tokenizer(bad)


def test_default_tokenizer_is_the_word_tokenizer() -> None:
    assert isinstance(load_tokenizer(None), WordTokenizer)


# --- routers -----------------------------------------------------------------------------------


@dataclass
class Cand:
    worker_id: str
    inflight: int = 0
    load: dict[str, Any] = field(default_factory=dict)


def test_round_robin_cycles() -> None:
    router = make_router("round-robin")
    cands = [Cand("a"), Cand("b"), Cand("c")]
    assert [router.choose(cands).worker_id for _ in range(6)] == list("abcabc")


def test_least_loaded_uses_published_load_plus_inflight() -> None:
    router = make_router("least-loaded")
    a = Cand("a", inflight=0, load={"running_requests": 10, "queued_requests": 2})
    b = Cand("b", inflight=3, load={"runningRequests": "4"})
    assert router.choose([a, b]).worker_id == "b"  # 12 vs 7
    b.inflight = 9  # 12 vs 13
    assert router.choose([a, b]).worker_id == "a"
    # ties rotate
    x, y = Cand("x"), Cand("y")
    assert {router.choose([x, y]).worker_id for _ in range(4)} == {"x", "y"}


def test_random_router_uses_all_and_unknown_router_fails() -> None:
    router = make_router("random", seed=1)
    cands = [Cand("a"), Cand("b")]
    assert {router.choose(cands).worker_id for _ in range(50)} == {"a", "b"}
    with pytest.raises(ValueError, match="kv"):
        make_router("kv")


def test_published_load_tolerates_garbage() -> None:
    assert published_load({}) == 0
    assert published_load({"running_requests": "x", "queued_requests": 2}) == 2


# --- parsing -----------------------------------------------------------------------------------


def test_completion_defaults_and_batch_of_one() -> None:
    tok = WordTokenizer()
    req = parse_completion({"model": "m", "prompt": ["a b"]}, tok, 16)
    assert req.token_ids == tok.encode("a b") and req.max_tokens == 16
    req = parse_completion({"model": "m", "prompt": [[4, 5]], "min_tokens": 40}, tok, 16)
    assert req.token_ids == [4, 5] and req.max_tokens == 40  # the default grows to min_tokens
    req = parse_completion({"model": "m", "prompt": "x", "logprobs": 0}, tok, 16)
    assert req.logprobs and req.top_logprobs == 0
    req = parse_completion({"model": "m", "prompt": "x", "nvext": {"ignore_eos": True}}, tok, 16)
    assert req.ignore_eos


def test_chat_template() -> None:
    tok = WordTokenizer()
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "s1 s2"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "u1"}, {"type": "text", "text": "u2"}],
            },
        ],
    }
    req = parse_chat(body, tok)
    assert req.token_ids == tok.encode("system: s1 s2\nuser: u1 u2\nassistant:")
    assert req.max_tokens is None  # chat leaves it to the sidecar (context window)
    with pytest.raises(ApiError) as info:
        parse_chat(
            {**body, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, tok
        )
    assert info.value.param == "messages[0].content"


# --- encoding and metrics ----------------------------------------------------------------------


def test_stream_encoder_events_are_valid_json() -> None:
    tok = WordTokenizer()
    req = parse_completion({"model": 'm"q', "prompt": "x"}, tok, 4)
    enc = StreamEncoder(req, "cmpl-1", 123, 'm"q')
    event = enc.chunk('a "quoted"\ntext')
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    obj = orjson.loads(event[6:])
    assert obj["choices"][0]["text"] == 'a "quoted"\ntext' and obj["model"] == 'm"q'
    tail = enc.finish("length", 7, {"worker_id": {}}, {"prompt_tokens": 1})
    parts = tail.split(b"\n\n")
    assert orjson.loads(parts[0][6:])["choices"][0]["stop_reason"] == 7
    assert orjson.loads(parts[1][6:])["usage"] == {"prompt_tokens": 1}
    assert parts[2] == b"data: [DONE]"


def test_trace_timing_fields() -> None:
    t = Trace("r", received_ns=1_000_000, received_wall_ms=5.0)
    t.prefill_start_ns, t.prefill_end_ns = 2_000_000, 4_000_000
    t.first_token_ns, t.end_ns = 6_000_000, 11_000_000
    assert t.timing() == {
        "request_received_ms": 5.0,
        "prefill_wait_time_ms": 1.0,
        "prefill_time_ms": 2.0,
        "ttft_ms": 5.0,
        "total_time_ms": 10.0,
    }


def test_metrics_render_prometheus_text() -> None:
    m = FrontendMetrics()
    m.finished("completions", "success", "w0", 5)
    m.ttft_hist("w0").observe(0.003)
    m.itl_hist("w0").observe(0.0002, 4)
    text = m.render({"aggregated": 1}, [("w0", 2)])
    assert (
        'lab_frontend_requests_total{endpoint="completions",outcome="success",worker="w0"} 1'
        in text
    )
    assert 'lab_frontend_ttft_seconds_bucket{worker="w0",le="0.005"} 1' in text
    assert 'lab_frontend_ttft_seconds_bucket{worker="w0",le="0.0025"} 0' in text
    assert 'lab_frontend_inter_token_seconds_count{worker="w0"} 4' in text
    assert 'lab_frontend_worker_inflight_requests{worker="w0"} 2' in text
    assert "# TYPE lab_frontend_ttft_seconds histogram" in text


def test_a_lagging_consumer_still_gets_one_event_per_chunk() -> None:
    """Dispatcher._consume over a real request-plane connection: the worker sends four CHUNKs
    and the END in one loop turn, so all of them are queued when the consumer first looks;
    each CHUNK still goes to the writer on its own (one SSE event each), never merged."""
    import asyncio
    from types import SimpleNamespace

    from lab.serve.frontend.dispatch import Dispatcher, _Request
    from lab.serve.frontend.protocol import GenRequest
    from lab.serve.request_plane import RequestPlaneClient, StreamSink
    from lab.shared.settings import SocketSettings
    from tests.serve.test_request_plane import collect, ok_end, start_server

    first_sent = asyncio.Event()

    async def handler(request: dict, sink: StreamSink) -> None:
        if request.get("probe"):
            sink.end(ok_end(0))
            return
        sink.chunk({"t": [1], "lp": [-0.1]})
        sink.chunk({"t": [2, 3], "lp": [-0.2, -0.3]})
        sink.chunk({"t": [4], "lp": [-0.4]})
        sink.chunk({"t": [5], "lp": [-0.5]})
        sink.end(ok_end(5))
        first_sent.set()

    seen: list[dict] = []
    offered: list[dict] = []  # chunks offered in the read callback: none, all were queued

    class Lagging:
        def write_now(self, p: dict) -> bool:
            offered.append(p)
            return False

        async def write(self, p: dict) -> None:
            seen.append(p)

    async def main() -> dict:
        server = await start_server(handler)
        client = RequestPlaneClient(server.address, SocketSettings(pool_size=1))
        try:
            stream = await client.open_stream({})
            async with asyncio.timeout(10):
                await first_sent.wait()
                # Frames keep their order on the connection: once a later stream's END has
                # arrived, every frame of the first one is queued.
                await collect(await client.open_stream({"probe": True}))
            dispatcher = Dispatcher.__new__(Dispatcher)
            dispatcher._unavailable = (ConnectionError,)
            worker = SimpleNamespace(worker_id="w0", inflight=0)
            req = _Request(GenRequest("completions", "m", [1]), Trace("r", 0, 0.0), Lagging(),
                           None, migrates=False)
            return await dispatcher._consume(worker, stream, req, None)
        finally:
            await client.close()
            await server.close()

    end = asyncio.run(main())
    assert end["finish"] == "length"
    assert offered == []
    assert seen == [
        {"t": [1], "lp": [-0.1]},
        {"t": [2, 3], "lp": [-0.2, -0.3]},
        {"t": [4], "lp": [-0.4]},
        {"t": [5], "lp": [-0.5]},
    ]
