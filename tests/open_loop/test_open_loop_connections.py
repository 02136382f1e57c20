"""Which kept-alive connection an open-loop send takes: the one idle longest, as aiohttp's pool
(and so AIPerf) does. A connection that has just answered can still hold its response's last
segment unacknowledged; a server that writes without TCP_NODELAY (Dynamo 1.6.1's HTTP listener,
docs/open-loop.md "Against AIPerf") then holds the next response's second write until the
client's delayed ACK, ~40 ms. Reusing the longest-idle connection keeps that stall out of an
open-loop level, where the lab's TTFT is compared with AIPerf's; `lab nagle` measures the stall
itself. Real sockets: the fake OpenAI server (aiohttp) records the client port of each request.
"""

from __future__ import annotations

import itertools

import numpy as np

from lab.load.client_settings import ClientSettings
from lab.load.workload import RequestSet, WorkloadSpec
from lab.open_loop.client import run_rate_level
from tests.load.fake_http import start
from tests.load.fake_openai import FakeOpenAI

BURST = 4  # requests due at once: they open BURST connections
LATER = 8  # then one at a time, each after the one before has ended
GAP_NS = 150_000_000  # between the later sends: > the server's 50 ms first token, generous


async def test_a_send_takes_the_connection_idle_longest() -> None:
    server = FakeOpenAI(model="m", ttft_s=0.05)
    runner, url = await start(server)
    try:
        offsets = np.array([0] * BURST + [(k + 2) * GAP_NS for k in range(LATER)],
                           dtype=np.int64)
        bodies = RequestSet(WorkloadSpec(isl=8, osl=2), "m", 0, len(offsets))
        result = await run_rate_level(url, list(bodies), offsets, rate=10.0,
                                      options=ClientSettings(in_process_client=True, timeout=30.0))
    finally:
        await runner.cleanup()
    assert all(r.ok for r in result.records), [r.error_message for r in result.records]
    ports = [peer[1] for peer in server.peer_order]
    burst, later = ports[:BURST], ports[BURST:]
    assert len(set(burst)) == BURST  # the burst opened a connection each
    # one at a time, each send took the connection idle longest: round-robin over the burst's
    # connections, never the one that has just answered
    assert set(later) == set(burst), later
    assert all(a != b for a, b in itertools.pairwise(later)), later
    assert later[BURST:] == later[:BURST], later
