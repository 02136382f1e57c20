"""Every engine step reaches the client as its own SSE event, on the whole launched stack
(engine, sidecar, frontend and the load client as separate processes over real sockets)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lab.analysis.rundir import read_requests
from tests import in_process

OSL = 128


def lab(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`lab` as its own process: `lab up --detach` and `lab down` (the detached launcher
    outlives the command)."""
    return subprocess.run([str(Path(sys.executable).parent / "lab"), *args],
                          capture_output=True, text=True, timeout=timeout)


def sweep(run: Path, *args: str) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    proc = in_process.lab("sweep", "--osl", str(OSL), "--isl", "32",
                          "--out", str(run), "--quiet", "--no-plots", *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    req = read_requests(run)
    req = req[~req["warmup"]]
    assert req["ok"].all(), req.loc[~req["ok"], ["error_kind", "error_message"]]
    return req, pd.read_csv(run / "levels.csv"), proc.stdout


@pytest.mark.parametrize("speedup", ["1000", "0", "1"])
def test_every_request_gets_one_event_per_token_at_c32(tmp_path: Path, speedup: str) -> None:
    req, levels, out = sweep(tmp_path / "run", "--conc", "32", "--requests", "64",
                             "--speedup", speedup)
    assert len(req) == 64
    assert (req["output_tokens"] == OSL).all()
    assert (req["chunks"] == OSL).all(), req["chunks"].value_counts()
    assert (req["tokens_per_chunk"] == 1.0).all()
    # ITL > 0: a request's events arrive spread over time. Events of one client read share its
    # stamp, and behind schedule (speedup 1000 or 0) the events of a stream that are ready
    # together share a write (docs/token-path.md): on a loaded machine one read may carry all
    # of a request's events. So that is asserted for most requests (nearly all on schedule);
    # the level's ITL must be positive.
    assert (req["itl_ms"] >= 0).all()
    spread = 0.9 if speedup == "1" else 0.5
    assert (req["itl_ms"] > 0).mean() >= spread, req["itl_ms"].describe()
    assert (req["ttft_ms"] <= req["latency_ms"]).all()
    assert levels["tokens_per_chunk"].tolist() == [1.0]
    assert (levels["itl_ms_avg"] > 0).all()
    # the per-token CPU figure is in levels.csv and the printed table
    assert levels["server_cpu_us_per_token"].notna().all()
    assert np.isclose(levels["server_cpu_us_per_token"].iloc[0] * OSL / 1000,
                      levels["server_cpu_ms_per_req"].iloc[0], rtol=0.01)
    assert "server CPU (us/token)" in out
    # and the whole machine's: the client's CPU per output token, and server + client
    client_us = levels["client_cpu_us_per_token"].iloc[0]
    assert client_us > 0
    assert np.isclose(levels["total_cpu_us_per_token"].iloc[0],
                      levels["server_cpu_us_per_token"].iloc[0] + client_us)
    assert "client CPU (us/token)" in out and "total CPU (us/token)" in out
    assert "every event carried one engine step's tokens" in out


def test_stream_interval_8_gives_16_events_of_8_tokens(tmp_path: Path) -> None:
    run = tmp_path / "run"
    req, _levels, _out = sweep(run, "--conc", "4", "--requests", "16", "--stream-interval", "8")
    assert (req["chunks"] == OSL // 8).all(), req["chunks"].value_counts()
    assert (req["tokens_per_chunk"] == 8.0).all()
    config = json.loads((run / "config.json").read_text())
    assert [f["stream_interval"] for f in config["topology"]["fleets"]] == [8]
    report = (run / "report.md").read_text()
    assert "stream interval 8" in report


def test_a_client_that_stops_reading_does_not_stall_the_other_streams(tmp_path: Path) -> None:
    """A raw HTTP client asks for a long stream and never reads it (its socket buffers fill,
    the frontend's writes block); meanwhile a sweep on the same stack gets every event."""
    up = lab("up", "--detach", "--out", str(tmp_path / "stack"),
             timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    url = next(w for w in up.stdout.split() if w.startswith("http://"))
    host, port = url.removeprefix("http://").split(":")
    try:
        body = json.dumps({"model": "mocker-model", "prompt": [5, 6, 7], "stream": True,
                           "max_tokens": 200_000, "min_tokens": 200_000,
                           "ignore_eos": True}).encode()
        with socket.create_connection((host, int(port)), timeout=30) as stalled:
            stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                            b"Content-Type: application/json\r\nContent-Length: "
                            + str(len(body)).encode() + b"\r\n\r\n" + body)
            head = b""
            while b"\r\n\r\n" not in head:  # the headers: the stream runs; now stop reading
                chunk = stalled.recv(1)
                assert chunk, "the frontend closed the stalled stream"
                head += chunk
            proc = in_process.lab("sweep", "--target", url, "--model", "mocker-model", "--conc",
                                  "8", "--requests", "32", "--osl", str(OSL), "--isl", "32",
                                  "--out", str(tmp_path / "run"), "--quiet", "--no-plots",
                                  "--timeout", "60")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        req = pd.read_parquet(tmp_path / "run" / "requests.parquet")
        req = req[~req["warmup"]]
        assert req["ok"].all() and len(req) == 32
        assert (req["chunks"] == OSL).all()
    finally:
        down = lab("down", str(tmp_path / "stack"), timeout=120)
        assert down.returncode == 0, down.stdout + down.stderr
