"""Per-step delivery over a real socket: one TokenOutput per engine pass at every speed (or per
`--stream-interval` tokens), and a stream whose reader stops does not hold up the others."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from lab.wire.gen.openengine.v1 import generation_pb2 as g
from tests.mocker.test_server_support import Engine, engine_process, request, tokens_of


@pytest.fixture(scope="module", params=["1000", "0"], ids=["speedup1000", "speedup0"])
def fast_engine(request, tmp_path_factory) -> Engine:
    """Engines whose passes cost far less wall time than their streams' writes."""
    speedup = request.param
    # Room for the unread stream below (1M tokens) to stay unfinished in the engine while the
    # other streams run, however slow the machine: by default its budget is clamped to the
    # 32k context, which an engine running free (nothing to wait for) generates in about a
    # second, and it would end before the test looks.
    with engine_process(tmp_path_factory.mktemp(f"d{speedup}"), f"engine-s{speedup}",
                        "--speedup-ratio", speedup, "--context-length", "2000000",
                        "--engine-args", '{"num_gpu_blocks": 131072}') as e:
        yield e


def test_every_pass_is_its_own_token_output(fast_engine: Engine) -> None:
    """32 concurrent streams of 128 tokens: each gets 128 one-token messages, never merged."""
    results: dict[int, list[g.GenerateResponse]] = {}

    def one(i: int) -> None:
        results[i] = fast_engine.generate(request(f"step-{i}", max_tokens=128), timeout=60)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert sorted(results) == list(range(32))
    for out in results.values():
        assert out[-1].WhichOneof("event") == "finished"
        assert [len(m.token.tokens) for m in out[:-1]] == [1] * 128
        assert len(tokens_of(out)) == 128


def test_a_stream_nobody_reads_does_not_hold_up_the_others(fast_engine: Engine) -> None:
    """One stream is opened and never read (its HTTP/2 window fills, its writes block); the
    engine marks it slow and keeps serving the others at full speed."""
    # ~1 KB per message (20 candidates each): the unread stream's window fills fast
    stalled = fast_engine.inference.Generate(
        request("unread", max_tokens=1_000_000, output_logprobs=True, output_top_n=20),
        timeout=120,
    )
    next(stalled)  # it is running
    try:
        fast_engine.proc.wait_log("request unread: its reader took no token", timeout=60)
        t0 = time.monotonic()
        for i in range(5):
            out = fast_engine.generate(request(f"other-{i}", max_tokens=2000), timeout=60)
            assert [len(m.token.tokens) for m in out[:-1]] == [1] * 2000
        assert time.monotonic() - t0 < 60
        assert fast_engine.load().running_requests >= 1  # the unread one is still in flight
    finally:
        stalled.cancel()


def test_stream_interval_sends_every_n_tokens_and_the_last(tmp_path: Path) -> None:
    with engine_process(tmp_path, "engine-si", "--speedup-ratio", "1000",
                        "--stream-interval", "8") as e:
        out = e.generate(request("si-1", max_tokens=128))
        assert [len(m.token.tokens) for m in out[:-1]] == [8] * 16
        out = e.generate(request("si-2", max_tokens=20))
        assert [len(m.token.tokens) for m in out[:-1]] == [8, 8, 4]


def test_stream_interval_is_bounded(tmp_path: Path) -> None:
    """0 and anything above MAX_STREAM_INTERVAL (whose messages could outgrow gRPC's limit) are
    refused with a message naming the option."""
    import subprocess
    import sys

    for value in ("0", "4097"):
        proc = subprocess.run(
            [str(Path(sys.executable).parent / "mocker"), "serve", "--stream-interval", value],
            capture_output=True, text=True, timeout=60,
        )
        assert proc.returncode == 2 and "--stream-interval" in proc.stderr, (value, proc.stderr)
        assert "Traceback" not in proc.stderr
        lab = subprocess.run(
            [str(Path(sys.executable).parent / "lab"), "sweep", "--stream-interval", value],
            capture_output=True, text=True, timeout=60,
        )
        assert lab.returncode == 2 and "--stream-interval" in lab.stderr, (value, lab.stderr)
