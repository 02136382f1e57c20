"""`--cancel`: the client closes the picked requests mid-stream (real sockets, the fake OpenAI
server of tests/load/fake_openai.py), records them as cancelled (not errors, in no latency
figure), and never arms a request it did not pick."""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import pytest
from click.testing import CliRunner

from lab.analysis.metrics import summarize_run
from lab.analysis.request_times import requests_frame
from lab.commands.sweep import sweep
from lab.load.cancel import CancelPlan, parse_cancel_after
from lab.load.client import run_level
from lab.load.client_settings import IN_PROCESS, ClientSettings
from lab.load.http1 import Http1Connection
from lab.load.record import rows
from lab.load.workload import WorkloadSpec, build_requests
from lab.open_loop.client import run_rate_level
from tests.load.fake_http import start
from tests.load.fake_openai import FakeOpenAI
from tests.waiting import wait_for

TOKEN_DELAY_S = 0.02


def _cancelling(plan: CancelPlan) -> ClientSettings:
    """In-process client settings whose --cancel options are `plan`'s."""
    return IN_PROCESS.model_copy(update={"cancel": plan.fraction, "cancel_after": plan.after,
                                         "cancel_seed": plan.seed})


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeOpenAI, str]]:
    server = FakeOpenAI(token_delay_s=TOKEN_DELAY_S)
    runner, url = await start(server)
    yield server, url
    await runner.cleanup()


def bodies(n: int, osl: int) -> list[dict]:
    return build_requests(WorkloadSpec(isl=20, osl=osl), "fake-model", n, level_seed=1)


def test_picks_are_seeded_and_near_the_fraction() -> None:
    plan = CancelPlan(0.1, "first", seed=3)
    picks = [i for i in range(20_000) if plan.picks(i)]
    assert picks == [i for i in range(20_000) if CancelPlan(0.1, "first", seed=3).picks(i)]
    assert abs(len(picks) / 20_000 - 0.1) < 0.01
    assert picks != [i for i in range(20_000) if CancelPlan(0.1, "first", seed=4).picks(i)]
    assert not any(CancelPlan(0.0).picks(i) for i in range(1000))
    assert all(CancelPlan(1.0).picks(i) for i in range(1000))


def test_cancel_after_spellings() -> None:
    assert CancelPlan(1, "first").events == 1 and CancelPlan(1, "first").delay_s is None
    assert CancelPlan(1, "8tok").events == 8
    assert CancelPlan(1, "250ms").delay_s == 0.25 and CancelPlan(1, "250ms").events is None
    for bad in ("", "0tok", "8", "-5ms", "1e3ms", "soon", "99999999999ms"):
        with pytest.raises(ValueError, match="is not a cancel delay"):
            parse_cancel_after(bad)


async def test_cancel_after_tokens_closes_mid_stream(fake: tuple[FakeOpenAI, str]) -> None:
    server, url = fake
    plan = CancelPlan(0.5, "3tok", seed=11)
    picked = {i for i in range(12) if plan.picks(i)}
    assert 0 < len(picked) < 12
    res = await run_level(url, bodies(12, osl=40), 4, options=_cancelling(plan))
    assert len(res.records) == 12
    for r in res.records:
        if r.index in picked:
            # closed after the read that brought its 3rd token: the fake sends one per 20 ms
            assert r.cancelled and not r.ok and r.error_kind is None, r
            assert r.chunks == 3 and r.cancelled_ns >= r.end_ns > r.sent_ns, r
        else:
            assert r.ok and not r.cancelled and r.cancelled_ns is None and r.chunks == 40, r
    # the server saw them go: every handler ended, none served to its end
    await wait_for(lambda: server.in_flight == 0, timeout=5, what="the fake to be idle")
    assert server.served == 12 - len(picked)
    levels = summarize_run(requests_frame(rows(res.records)).assign(repeat=0))
    row = levels.iloc[0]
    assert row["cancelled"] == len(picked) and row["failed"] == 0 and row["errors"] == "0"
    assert row["ok"] == 12 - len(picked)
    # latency figures are over the completed requests only: 40 tokens, 20 ms apart
    assert row["latency_ms_min"] > 39 * TOKEN_DELAY_S * 1000 * 0.9


async def test_cancel_after_a_delay(fake: tuple[FakeOpenAI, str]) -> None:
    server, url = fake
    res = await run_level(url, bodies(4, osl=200), 2,
                          options=_cancelling(CancelPlan(1.0, "100ms")))
    for r in res.records:
        assert r.cancelled, r
        waited_ms = (r.cancelled_ns - r.sent_ns) / 1e6
        assert 100 <= waited_ms < 1000, waited_ms
        assert 0 < r.chunks < 200
    await wait_for(lambda: server.in_flight == 0, timeout=5, what="the fake to be idle")
    assert server.served == 0


async def test_no_plan_arms_nothing(fake: tuple[FakeOpenAI, str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """--cancel 0 (or a plan that picks none) keeps the plain read path: nothing is armed."""
    armed: list[int] = []
    real = Http1Connection.arm_cancel

    def spy(self: Http1Connection, raw, events, delay_s) -> None:  # type: ignore[no-untyped-def]
        armed.append(1)
        real(self, raw, events, delay_s)

    monkeypatch.setattr(Http1Connection, "arm_cancel", spy)
    _, url = fake
    for options in (IN_PROCESS, _cancelling(CancelPlan(0.0, "first"))):
        res = await run_level(url, bodies(6, osl=4), 2, options=options)
        assert all(r.ok and not r.cancelled for r in res.records)
    assert armed == []
    res = await run_level(url, bodies(6, osl=4), 2,
                          options=_cancelling(CancelPlan(1.0, "first")))
    assert len(armed) == 6 and all(r.cancelled for r in res.records)


async def test_the_open_loop_cancels_too(fake: tuple[FakeOpenAI, str]) -> None:
    server, url = fake
    offsets = np.arange(6, dtype=np.int64) * 5_000_000  # 5 ms apart
    res = await run_rate_level(url, bodies(6, osl=40), offsets, rate=200.0,
                               options=_cancelling(CancelPlan(1.0, "2tok")))
    assert len(res.records) == 6
    assert all(r.cancelled and r.chunks == 2 for r in res.records), res.records
    await wait_for(lambda: server.in_flight == 0, timeout=5, what="the fake to be idle")
    assert server.served == 0


def test_cancel_with_turns_is_a_usage_error() -> None:
    result = CliRunner().invoke(sweep, ["--target", "http://127.0.0.1:9", "--turns", "3",
                                        "--endpoint", "chat",
                                        "--cancel", "0.5"])
    assert result.exit_code == 2 and "--cancel and --turns are alternatives" in result.output
