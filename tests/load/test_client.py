"""The closed-loop client against an in-test fake OpenAI SSE server (real sockets)."""

from __future__ import annotations

import asyncio
import io
import itertools
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import overload

import pytest

from lab.analysis.client_health import client_health
from lab.analysis.request_times import requests_frame
from lab.load.client import LevelProgress, run_level
from lab.load.client_settings import ClientSettings
from lab.load.record import RECORD_FIELDS, rows
from lab.load.sweep import LineProgress
from lab.load.workload import RequestSet, WorkloadSpec, build_requests
from lab.shared.hf_tokenizer import load_hf
from tests.load.fake_http import start
from tests.load.fake_openai import (
    FAIL_CUT,
    FAIL_HTTP,
    FAIL_SHAPE,
    FAIL_STREAM,
    SHAPE_EVENTS,
    FakeOpenAI,
)
from tests.load.small_tokenizer import make_tokenizer


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeOpenAI, str]]:
    server = FakeOpenAI(token_delay_s=0.002)
    runner, url = await start(server)
    yield server, url
    await runner.cleanup()


def bodies(n: int, osl: int = 8) -> list[dict]:
    return build_requests(WorkloadSpec(isl=20, osl=osl), "fake-model", n, level_seed=1)


async def test_exact_concurrency_and_ordered_timestamps(fake: tuple[FakeOpenAI, str]) -> None:
    server, url = fake
    seen: list[LevelProgress] = []
    res = await run_level(url, bodies(60), 8, warmup=8, progress=seen.append)
    assert server.peak == 8  # never more than N in flight, and N reached
    assert len(res.records) == 60 and [r.index for r in res.records] == list(range(60))
    assert sum(r.warmup for r in res.records) == 8
    for r in res.records:
        assert r.ok, r
        assert r.scheduled_ns <= r.sent_ns <= r.first_ns <= r.end_ns <= r.done_ns
        times = r.chunk_times_ns
        assert times == sorted(times)
        # role-only first chunk and usage-only last chunk are not tokens
        assert r.chunks == 8 and r.output_tokens == 8
        assert r.output_tokens_source == "usage" and r.input_tokens == 20
        assert r.finish_reason == "length" and r.decode_worker_id == "fake-worker"
        assert r.http_status == 200 and r.error_kind is None
        # stamps and counts only: every millisecond figure is the analysis's
        assert not [k for k in RECORD_FIELDS if k.endswith("_ms")], r
    df = requests_frame(rows(res.records))
    assert df["ttft_ms"].to_numpy() == pytest.approx((df["first_ns"] - df["sent_ns"]) / 1e6)
    assert df["latency_ms"].to_numpy() == pytest.approx((df["end_ns"] - df["sent_ns"]) / 1e6)
    assert df["itl_ms"].to_numpy() == pytest.approx((df["latency_ms"] - df["ttft_ms"]) / 7)
    assert (df["send_delay_ms"] >= 0).all()
    c = client_health(res.procs, df)
    assert c["cpu_ms_per_request"] > 0 and c["send_delay_p99_ms"] is not None
    assert c["loop_lag_p99_ms"] is not None and c["started_ns"] < c["ended_ns"]
    assert seen and seen[-1].done == 60 and seen[-1].errors == 0


class SlowBodies(list):
    """Request bodies that take a while each to build, as long prompts do with a HuggingFace
    tokenizer (576 of 4096 tokens: ~3.4 s on the prebuild's two threads)."""

    built = 0

    def __getitem__(self, i):  # type: ignore[override]
        time.sleep(0.02)
        self.built += 1
        return super().__getitem__(i)


async def test_a_slow_prompt_build_reports_progress_before_the_first_send(
    fake: tuple[FakeOpenAI, str],
) -> None:
    _, url = fake
    seen: list[LevelProgress] = []
    n = 100  # ~1 s to build on two threads: past the 0.5 s progress interval
    res = await run_level(url, SlowBodies(bodies(n)), 4, progress=seen.append)
    assert len(res.records) == n and all(r.ok for r in res.records)
    building = [p for p in seen if p.building]
    assert building, seen
    assert all(0 < p.done < n and p.total == n for p in building)
    first_send = next(i for i, p in enumerate(seen) if not p.building)
    assert all(p.building for p in seen[:first_send]) and not any(
        p.building for p in seen[first_send:])
    assert seen[-1].done == n and not seen[-1].building
    terminal = Terminal()
    line = LineProgress(stream=terminal)
    line.start("c=4")
    line.update(building[0])
    assert terminal.getvalue().strip() == (
        f"c=4: building prompts {building[0].done}/{n}, {building[0].elapsed_s:.1f} s")


async def test_a_cancelled_level_stops_building_its_prompts(
    fake: tuple[FakeOpenAI, str],
) -> None:
    """SIGTERM cancels a sweep's level: a build of thousands of long prompts must not hold
    the sweep (and the stack it tears down) until it is done."""
    server, url = fake
    n = 2000  # ~20 s to build
    building = asyncio.Event()
    slow = SlowBodies(bodies(n))
    level = asyncio.create_task(run_level(
        url, slow, 4, progress=lambda p: building.set() if p.building else None))
    await asyncio.wait_for(building.wait(), 60)
    level.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(level, 10)
    stopped_at = slow.built
    assert stopped_at < n / 2, stopped_at
    await asyncio.sleep(0.2)  # the build threads stop at their next prompt
    assert slow.built <= stopped_at + 4, (stopped_at, slow.built)
    assert server.served == 0


async def test_prebuilt_prompts_reach_the_server_as_built_one_by_one_in_order(
    fake: tuple[FakeOpenAI, str], tmp_path: Path,
) -> None:
    """A counted level builds its prompts on threads before the first send: each request
    still carries the prompt of its index, exact in the tokenizer, as a lone build gives."""
    server, url = fake
    tok_dir = make_tokenizer(tmp_path)
    spec = WorkloadSpec(isl=90, osl=4, isl_stddev=30, shared_prefix=20, prompt_kind="text",
                        tokenizer=str(tok_dir))
    requests = RequestSet(spec, server.model, level_seed=3, n=40)
    res = await run_level(url, requests, 1)
    assert all(r.ok for r in res.records)
    lone = RequestSet(spec, server.model, level_seed=3, n=40)
    assert server.prompts == [lone[i]["prompt"] for i in range(40)]
    tok = load_hf(tok_dir)
    assert [len(tok.encode(p, add_special_tokens=False).ids) for p in server.prompts] == [
        r.isl_requested for r in res.records]


class Terminal(io.StringIO):
    """A stderr that is a terminal, where the progress line is drawn."""

    def isatty(self) -> bool:
        return True


async def test_one_in_flight_reuses_one_connection(fake: tuple[FakeOpenAI, str]) -> None:
    server, url = fake
    res = await run_level(url, bodies(10), 1)
    assert server.peak == 1 and len(server.peers) == 1
    recs = res.records
    for a, b in itertools.pairwise(recs):  # closed loop: next sent after previous done
        assert b.sent_ns >= a.done_ns


async def test_fresh_connection_per_request(fake: tuple[FakeOpenAI, str]) -> None:
    server, url = fake
    await run_level(url, bodies(6), 1,
        options=ClientSettings(in_process_client=True, fresh_connection=True))
    assert len(server.peers) == 6


async def test_failed_requests_are_rows(fake: tuple[FakeOpenAI, str]) -> None:
    _server, url = fake
    reqs = bodies(12)
    reqs[3]["prompt"][0] = FAIL_HTTP
    reqs[5]["prompt"][0] = FAIL_STREAM
    reqs[7]["prompt"][0] = FAIL_CUT
    res = await run_level(url, reqs, 4)
    assert len(res.records) == 12
    kinds = {r.index: r.error_kind for r in res.records if not r.ok}
    assert kinds == {3: "http_503", 5: "stream_error", 7: "disconnect"}
    r3 = res.records[3]
    assert r3.http_status == 503 and "no worker" in r3.error_message
    assert "engine died" in res.records[5].error_message
    assert res.records[5].chunks == 2  # the tokens before the error are still recorded


async def test_wrongly_shaped_events_are_per_request_errors(fake: tuple[FakeOpenAI, str]) -> None:
    """A target that sends well-formed JSON of the wrong shape fails those requests (the line
    recorded), not the client or the level."""
    _server, url = fake
    reqs = bodies(12)
    shaped = {}
    for i, shape in enumerate(SHAPE_EVENTS):
        reqs[i]["prompt"][:2] = [FAIL_SHAPE, i]
        shaped[i] = shape
    res = await run_level(url, reqs, 4)
    assert len(res.records) == 12
    for i, shape in shaped.items():
        rec = res.records[i]
        assert not rec.ok and rec.error_kind == "protocol", (shape, rec)
        assert shape.decode()[:20] in rec.error_message or "usage." in rec.error_message
    assert all(r.ok for r in res.records[len(shaped):])


async def test_unreachable_server_gives_connect_errors() -> None:
    res = await run_level("http://127.0.0.1:9", bodies(3), 2)
    assert [r.error_kind for r in res.records] == ["connect"] * 3


async def test_timed_level_stops_claiming(fake: tuple[FakeOpenAI, str]) -> None:
    from lab.load.workload import RequestSet

    _server, url = fake
    rs = RequestSet(WorkloadSpec(isl=20, osl=4), "fake-model", 1, 10**9)
    res = await run_level(url, rs, 4,
        options=ClientSettings(in_process_client=True, duration_s=0.5))
    assert 4 <= len(res.records) < 10**6
    assert client_health(res.procs, requests_frame(rows(res.records)))["wall_s"] < 5


class _SlowBodies(Sequence[dict]):
    """Bodies built on demand, each taking `build_s` of the client's time: a timed level's
    prompt synthesis at a long ISL (exact_text costs ~28 ms at 4096 tokens)."""

    def __init__(self, n: int, build_s: float) -> None:
        self.made = bodies(n)
        self.build_s = build_s

    def __len__(self) -> int:
        return len(self.made)

    @overload
    def __getitem__(self, i: int) -> dict: ...
    @overload
    def __getitem__(self, i: slice) -> list[dict]: ...
    def __getitem__(self, i: int | slice) -> dict | list[dict]:
        time.sleep(self.build_s)  # the synthesis: CPU on the client's loop, before any send
        return self.made[i]


async def test_a_timed_levels_prompt_synthesis_is_not_in_its_ttft(
    fake: tuple[FakeOpenAI, str],
) -> None:
    """A timed level builds each body when it is sent: the build is the client's time, so the
    send stamp follows it (the server here answers in ~2 ms; a build of 150 ms inside the
    stamp would put every TTFT above 150 ms)."""
    _server, url = fake
    res = await run_level(url, _SlowBodies(1000, 0.15), 1,
        options=ClientSettings(in_process_client=True, duration_s=0.5))
    assert res.records
    assert all(r.ok and r.first_ns for r in res.records)
    ttfts_ms = [((r.first_ns or 0) - (r.sent_ns or 0)) / 1e6 for r in res.records]
    assert max(ttfts_ms) < 100, ttfts_ms


async def test_several_client_processes_merge(fake: tuple[FakeOpenAI, str]) -> None:
    server, url = fake
    res = await run_level(url, bodies(40), 6, warmup=2,
        options=ClientSettings(in_process_client=True, client_procs=2))
    assert server.peak == 6
    assert sorted(r.index for r in res.records) == list(range(40))
    assert {r.client_proc for r in res.records} == {0, 1}
    assert all(r.ok for r in res.records)
    assert len(res.procs) == 2
    c = client_health(res.procs, requests_frame(rows(res.records)))
    assert c["procs"] == 2
