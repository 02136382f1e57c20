"""Writes are batched, events never: on the whole launched stack (engine, sidecar, frontend and
the load client as separate processes over real sockets), the engine's run-ahead window lets
several events of one stream share the socket writes down the path, so the client reads many
events per read(), while each event still carries exactly one engine step's token; on schedule
(speedup 1) the events stay spaced by the schedule (docs/token-path.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from tests.commands.test_token_stream import sweep


def topology(tmp_path: Path, run_ahead: int) -> str:
    path = tmp_path / f"run-ahead-{run_ahead}.toml"
    path.write_text(f'extra_mocker_args = ["--run-ahead", "{run_ahead}"]\n')
    return str(path)


def reads_per_request(req: pd.DataFrame) -> pd.Series:
    """How many client reads carried a request's events: every event of one read shares that
    read's stamp (lab/load/sse.py), so this is the number of distinct stamps."""
    return req["chunk_times_ns"].map(lambda stamps: len(np.unique(np.asarray(stamps))))


def test_events_of_one_stream_share_a_write_each_still_its_own_event(tmp_path: Path) -> None:
    """Speedup 0 (every pass is due at once) and a window of 32: the engine hands a stream 32
    tokens at a time, each its own TokenOutput, CHUNK and SSE event, and the gRPC, request-plane
    and HTTP writes each carry them together, so a request's 128 events arrive in a handful of
    reads (lock-step, one write per event, gives about one read per event)."""
    req, levels, _out = sweep(tmp_path / "run", "--conc", "2", "--requests", "8", "--speedup",
                              "0", "--topology", topology(tmp_path, 32))
    assert len(req) == 8
    assert (req["chunks"] == 128).all(), req["chunks"].value_counts()  # one event per token
    assert (req["tokens_per_chunk"] == 1.0).all()
    assert levels["tokens_per_chunk"].tolist() == [1.0]
    reads = reads_per_request(req)
    # 128 tokens in runs of up to 32: the first token alone (the prefill pass), the last alone
    # (a finishing pass is never fast-forwarded), ~4 runs in between; reads <= 16 means at least
    # 8 events per read on average.
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
