"""The run-ahead window over a real socket (docs/token-path.md): a reader that stops reading
stalls only its own stream, and a stream that keeps up gets every token, one TokenOutput each,
with the engine running ahead (`mocker serve --run-ahead`, speedup 0)."""

from __future__ import annotations

import socket
import struct
import time

import h2.config
import h2.connection
import h2.settings
import pytest

from lab.wire.gen.openengine.v1 import generation_pb2 as g
from tests.mocker.test_server_generate import expected_tokens
from tests.mocker.test_server_support import (
    Engine,
    assert_one_terminal,
    engine_process,
    request,
    tokens_of,
)


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> Engine:
    with engine_process(tmp_path_factory.mktemp("run-ahead"), "engine-run-ahead",
                        "--speedup-ratio", "0", "--run-ahead", "8") as e:
        yield e


def stalled_generate(address: str, req: g.GenerateRequest) -> socket.socket:
    """Open Generate on a raw HTTP/2 connection that announces a 1 KiB stream window and then
    never reads nor sends a WINDOW_UPDATE: the engine can write about 1 KiB of the stream, then
    its writes block, as for a client whose reader stopped."""
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.local_settings = h2.settings.Settings(
        client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1024})
    conn.initiate_connection()
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, [
        (":method", "POST"), (":scheme", "http"), (":path", "/openengine.v1.Inference/Generate"),
        (":authority", address), ("content-type", "application/grpc"), ("te", "trailers"),
    ])
    body = req.SerializeToString()
    conn.send_data(sid, b"\x00" + struct.pack(">I", len(body)) + body, end_stream=True)
    sock.sendall(conn.data_to_send())
    return sock


def test_a_stalled_reader_stalls_only_its_own_stream(engine: Engine) -> None:
    stalled = stalled_generate(engine.address, request("stalled-1", max_tokens=30_000))
    try:
        # the engine sees the stalled stream as running before the other one starts
        deadline = time.monotonic() + 30
        while engine.load().running_requests < 1:
            assert time.monotonic() < deadline, "the stalled request never started"
            time.sleep(0.01)
        # far below the 30 s stall watchdog: the other stream must not wait for the stalled one
        out = engine.generate(request("flowing-1", max_tokens=2000), timeout=10)
        assert assert_one_terminal(out).finished.reason == g.FINISH_REASON_LENGTH
        assert tokens_of(out) == expected_tokens("flowing-1", 2000)
        # run ahead, never merged: one TokenOutput per step
        assert [len(m.token.tokens) for m in out[:-1]] == [1] * 2000
    finally:
        stalled.close()
