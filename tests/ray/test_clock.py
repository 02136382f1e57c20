"""Clock offsets: a client node whose clock runs an hour ahead of the driver's. The pool
measures the offset NTP-style (within its stated error bound), starts the actor at the
driver's start on the actor's clock, and moves every stamp it returns onto the driver's clock:
the merged records fall inside the driver's own window of the level."""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from lab.load.client import run_level
from lab.load.client_settings import ClientSettings
from lab.load.ray_client import LoadClientActor, RayClientPool, shift_record
from lab.load.ray_settings import RaySettings
from tests.procs import Proc
from tests.ray.conftest import CLIENT_RESOURCE, NODES, RayCluster

SKEW_NS = 3600 * 10**9
CONC = 6
REQUESTS = 36


class SkewedClientActor(LoadClientActor):
    """A client node whose perf counter reads SKEW_NS ahead of the driver's."""

    def clock(self) -> int:
        return super().clock() + SKEW_NS

    async def closed(self, *args: Any) -> AsyncIterator[dict]:  # type: ignore[override]
        *rest, start_ns = args
        async for batch in super().closed(*rest, start_ns - SKEW_NS):
            for rec in batch["records"]:
                shift_record(rec, -SKEW_NS)
            if "info" in batch:
                batch["info"]["started_ns"] += SKEW_NS
                batch["info"]["ended_ns"] += SKEW_NS
            yield batch


async def test_stamps_moved_onto_the_driver_clock(ray_cluster: RayCluster,
                                                  spawn: Callable[..., Proc]) -> None:
    server = spawn("fake", [sys.executable, "-m", "tests.load.fake_openai", "--port", "0",
                            "--token-delay-ms", "2"])
    url = f"http://{server.address}"
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    pool = RayClientPool(RaySettings(ray=ray_cluster.address, ray_client_nodes=NODES,
                                     ray_client_resource=CLIENT_RESOURCE))
    try:
        pool.start()
        for m in pool.members:  # the same bundles, skewed clocks
            ray.kill(m.actor)
            m.actor = ray.remote(SkewedClientActor).options(
                num_cpus=1, scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pool.pg, placement_group_bundle_index=m.bundle)).remote()
        bodies = [{"model": "fake-model", "prompt": [1, 2, 3], "max_tokens": 4, "stream": True}
                  for _ in range(REQUESTS)]
        t0 = time.perf_counter_ns()
        result = await run_level(url, bodies, CONC,
            options=ClientSettings(in_process_client=True), remote=pool)
        t1 = time.perf_counter_ns()
    finally:
        pool.close()
    assert len(result.records) == REQUESTS and all(r.ok for r in result.records)
    for info in result.procs:  # the offset measured, within the stated bound
        assert abs(info["clock_offset_ns"] - SKEW_NS) <= info["clock_error_ns"] < 10**9
        assert t0 <= info["started_ns"] <= info["ended_ns"] <= t1
    for r in result.records:  # every stamp on the driver's clock
        assert r.scheduled_ns is not None and r.sent_ns is not None and r.done_ns is not None
        assert t0 <= r.scheduled_ns <= r.sent_ns < r.done_ns <= t1, r
        assert all(t0 <= t <= t1 for t in r.chunk_times_ns)
