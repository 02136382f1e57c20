"""A server that closes idle kept-alive connections (uvicorn's timeout_keep_alive, 5 s in vLLM)
must cause no error the server did not cause: a request written into a reused connection the
server is closing, and lost before any byte of its response came back, is resent once on a new
connection and counted in the client's health (`resends`). Real sockets
(tests/load/idle_close_server.py makes the race at the idle boundary deterministic).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
import pytest

from lab.analysis.client_health import client_health
from lab.analysis.request_times import requests_frame
from lab.load.client import run_level
from lab.load.client_settings import ClientSettings
from lab.load.record import rows
from lab.load.workload import WorkloadSpec, build_requests
from lab.open_loop.client import run_rate_level
from tests.load.idle_close_server import IdleCloseServer

IDLE_S = 0.3  # the server's keep-alive timeout
WINDOW_S = 0.15  # a request arriving within this of the idle close is lost with the connection
GAP_MS = 220  # the client reuses its connections 220 ms after a response: inside the window


@pytest.fixture
async def server() -> AsyncIterator[tuple[IdleCloseServer, str]]:
    srv = IdleCloseServer(idle_s=IDLE_S, window_s=WINDOW_S)
    url = await srv.start()
    yield srv, url
    await srv.stop()


def bodies(n: int) -> list[dict]:
    return build_requests(WorkloadSpec(isl=20, osl=2), "m", n, level_seed=1)


async def test_closed_loop_resends_a_request_lost_to_an_idle_close(
        server: tuple[IdleCloseServer, str]) -> None:
    srv, url = server
    res = await run_level(url, bodies(6), 2,
        options=ClientSettings(in_process_client=True, gap_ms=GAP_MS))
    errors = [(r.error_kind, r.error_message) for r in res.records if not r.ok]
    assert errors == [] and len(res.records) == 6
    assert srv.dropped >= 1  # the boundary was hit: requests were lost and resent
    health = client_health(res.procs, requests_frame(rows(res.records)))
    assert health["resends"] == srv.dropped
    assert srv.answered == 6


async def test_open_loop_resends_a_request_lost_to_an_idle_close(
        server: tuple[IdleCloseServer, str]) -> None:
    srv, url = server
    offsets = (np.arange(4) * GAP_MS * 1e6).astype(np.int64)  # one idle connection, reused
    res = await run_rate_level(url, bodies(4), offsets, rate=1000 / GAP_MS)
    errors = [(r.error_kind, r.error_message) for r in res.records if not r.ok]
    assert errors == [] and len(res.records) == 4
    assert srv.dropped >= 1
    health = client_health(res.procs, requests_frame(rows(res.records)))
    assert health["resends"] == srv.dropped
    assert srv.answered == 4


async def test_keep_alive_header_retires_idle_connections_before_the_server_does() -> None:
    """A server that says `Keep-Alive: timeout=N` is never handed a connection idle that long:
    the client opens a new one instead (no loss, nothing to resend)."""
    srv = IdleCloseServer(idle_s=1.0, window_s=0.9, keep_alive_header=True)
    url = await srv.start()
    try:
        res = await run_level(url, bodies(3), 1,
            options=ClientSettings(in_process_client=True, gap_ms=950))
    finally:
        await srv.stop()
    assert [r.error_kind for r in res.records] == [None] * 3
    assert srv.dropped == 0 and srv.connections == 3
    assert client_health(res.procs, requests_frame(rows(res.records)))["resends"] == 0
