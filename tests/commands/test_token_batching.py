"""Writes are batched, events never: on the whole launched stack (engine, sidecar, frontend and
the load client as separate processes over real sockets), the engine's run-ahead window lets
several events of one stream share the socket writes down the path, so the client reads many
events per read(), while each event still carries exactly one engine step's token; on schedule
(speedup 1) the events stay spaced by the schedule (docs/token-path.md)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from lab.analysis.rundir import read_requests
from tests import in_process
from tests.commands.test_token_stream import lab, sweep


def topology(tmp_path: Path, run_ahead: int) -> str:
    path = tmp_path / f"run-ahead-{run_ahead}.toml"
    path.write_text(f'extra_mocker_args = ["--run-ahead", "{run_ahead}"]\n')
    return str(path)


def reads_per_request(req: pd.DataFrame) -> pd.Series:
    """How many client reads carried a request's events: every event of one read shares that
    read's stamp (lab/load/sse.py), so this is the number of distinct stamps."""
    return req["chunk_times_ns"].map(lambda stamps: len(np.unique(np.asarray(stamps))))


def write_syscalls(pid: int) -> int:
    """write()/writev() calls the process made so far (`syscw` of /proc/PID/io): the engine's
    HTTP/2 writes and the frontend's HTTP writes go through them (uvloop transports)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("syscw:"):
            return int(line.split()[1])
    raise AssertionError(f"no syscw in /proc/{pid}/io")


def test_events_of_one_stream_share_a_write_each_still_its_own_event(tmp_path: Path) -> None:
    """Speedup 0 (every pass is due at once) and a window of 32: the engine hands a stream 32
    tokens at a time, each its own TokenOutput, CHUNK and SSE event, and the engine's gRPC
    writes and the frontend's HTTP writes each carry them together (lock-step: about one
    engine write per pass, so one per event of a lone stream); the client then reads a
    request's 128 events in a handful of reads."""
    stack = tmp_path / "stack"
    up = lab("up", "--detach", "--speedup", "0", "--topology", topology(tmp_path, 32),
             "--out", str(stack), timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        state = json.loads((stack / "state.json").read_text())
        pids = {p["role"]: p["pid"] for p in state["processes"]}
        before = {role: write_syscalls(pid) for role, pid in pids.items()}
        proc = in_process.lab("sweep", "--target", state["frontend_url"], "--model",
                              "mocker-model", "--conc", "1", "--requests", "8", "--warmup", "0",
                              "--osl", "128", "--isl", "32", "--out", str(tmp_path / "run"),
                              "--quiet", "--no-plots")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        writes = {role: write_syscalls(pid) - before[role] for role, pid in pids.items()}
    finally:
        down = lab("down", str(stack), timeout=120)
        assert down.returncode == 0, down.stdout + down.stderr
    req = read_requests(tmp_path / "run")
    assert len(req) == 8 and req["ok"].all()
    assert (req["chunks"] == 128).all(), req["chunks"].value_counts()  # one event per token
    assert (req["tokens_per_chunk"] == 1.0).all()
    events = int(req["chunks"].sum())
    # 128 tokens in runs of up to 32 (the first token alone: the prefill pass; the last alone:
    # a finishing pass is never fast-forwarded): ~7 writes per request, plus the terminal and
    # the odd log line; 1/8 of a write per event leaves room for those
    assert writes["engine"] <= events / 8, (writes, events)
    assert writes["frontend"] <= events / 8, (writes, events)
    reads = reads_per_request(req)
    assert (reads <= 16).all(), reads.tolist()


def test_on_schedule_the_events_stay_spaced(tmp_path: Path) -> None:
    """Speedup 1 with the same window: no pass has ended before it is run, so each is slept
    to and handed out alone; the client reads the events one by one, as the schedule spaces
    them (a pass handed out before its simulated end would arrive batched)."""
    req, _levels, _out = sweep(tmp_path / "run", "--conc", "4", "--requests", "8", "--speedup",
                               "1", "--topology", topology(tmp_path, 32))
    assert (req["chunks"] == 128).all(), req["chunks"].value_counts()
    assert (req["tokens_per_chunk"] == 1.0).all()
    reads = reads_per_request(req)
    # a stall of the loaded machine longer than a pass may put two events in one read
    assert reads.median() >= 0.8 * 128, reads.tolist()
