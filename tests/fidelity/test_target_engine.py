"""What a target publishes about its engine (lab.fidelity.target_engine): vLLM's cache config
gauge on /metrics and the model's context length on /v1/models, read over a real socket."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread

import pytest

from lab.fidelity.target_engine import cache_config, read_target_engine

#: lines of vLLM 0.32's /metrics with stats on (labels in the order vLLM writes them, trimmed)
METRICS = (
    "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
    "# TYPE vllm:cache_config_info gauge\n"
    'vllm:cache_config_info{block_size="128",cache_dtype="auto",enable_prefix_caching="True",'
    'engine="0",num_gpu_blocks="4096",sliding_window="None"} 1.0\n'
    'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 0.0\n')
MODELS = {"object": "list", "data": [{"id": "tiny-llama", "max_model_len": 8192}]}


def test_cache_config_labels_become_engine_args() -> None:
    assert cache_config(METRICS) == {"block_size": 128, "num_gpu_blocks": 4096,
                                     "enable_prefix_caching": True}
    assert cache_config("vllm:num_requests_running 0.0\n") == {}


@pytest.fixture
def target() -> Iterator[str]:
    """An HTTP server answering /metrics and /v1/models as vLLM does (port 0)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = {"/metrics": METRICS.encode(),
                    "/v1/models": json.dumps(MODELS).encode()}.get(self.path)
            self.send_response(200 if body else 404)
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_target_is_read_over_http(target: str) -> None:
    found = read_target_engine(target, "tiny-llama")
    assert found.args == {"block_size": 128, "num_gpu_blocks": 4096,
                          "enable_prefix_caching": True}
    assert set(found.sources) == set(found.args) and found.max_model_len == 8192
    assert read_target_engine(target, "other-model").max_model_len is None


def test_a_target_that_publishes_nothing_gives_nothing() -> None:
    found = read_target_engine("http://127.0.0.1:9", "m")  # nothing listens on port 9
    assert found.args == {} and found.max_model_len is None
