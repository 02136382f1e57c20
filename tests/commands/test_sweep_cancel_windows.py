"""Cancellation over real processes, driven in process: a launched Stack (the real engines,
sidecars and frontend), the sweep's level runner with the leak check after each level, exactly
as `lab sweep --cancel` wires them (`lab.commands.sweep._launched`).

* A deliberately leaking engine (`tests.serve.leaky_engine`: a cancel leaves its KV blocks
  held) fails the level, the message naming that engine and the figure.
* Disaggregated, the client's cancel lands in each of the three windows of a request's life:
  during the prefill leg, during the handoff (the prefill leg is done, the decode leg waits
  for its KV transfer) and during decode; after each, both engines (and the sidecars, the
  frontend) are back at their idle values.

The windows are made wide by the engines' timing: a fixed 1 s prefill pass, then ~1.6 s of
KV transfer (64 prompt tokens x 131072 B at 0.0052 GB/s; under the decode sidecar's 2 s
no-progress limit), then 10 ms decode steps. Cancel at 300 ms is inside the prefill pass, at
1.8 s inside the transfer (the prefill leg has ended, the decode leg has not sent its first
token), after 3 tokens in decode. The
requests ask for 2000 tokens (20 s of decode): an engine that kept working on a cancelled
request would still hold it when the check's wait ends.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from lab.load.cancel import CancelPlan
from lab.load.client import ClientOptions
from lab.load.sweep import SweepPlan, SweepRunner
from lab.load.workload import WorkloadSpec
from lab.sweep.leak_check import LEAKS_JSON, LeakCheck, LeakFound, after_level_check
from launch.commands import Programs
from launch.stack import Stack
from launch.topology import FleetSpec, TopologySpec

SIDECAR_ARGS = ["--grace-period", "0.5"]
ENGINE_FIGURES = {"running_requests", "queued_requests", "used_kv_blocks", "open_streams"}
SETTLE_S = 4.0


def fixed(prefill_ms: float, decode_ms: float) -> dict:
    return {"timing": {"type": "fixed", "prefill_ms": prefill_ms, "decode_ms": decode_ms}}


async def cancel_level(stack: Stack, check: LeakCheck, run_dir: Path, plan: CancelPlan, *,
                       isl: int, osl: int) -> SweepRunner:
    """One c=2 level of 2 requests, every one cancelled by `plan`'s delay, then the check."""
    run_dir.mkdir()
    sweep = SweepPlan(concurrency=[2], workload=WorkloadSpec(isl=isl, osl=osl), requests=2,
                      warmup=0, client=ClientOptions(cancel=plan))
    runner = SweepRunner(run_dir, stack.frontend_url, stack.model, sweep,
                         after_level=after_level_check(check, run_dir, lambda _: None))
    await runner.run()
    return runner


def report(run_dir: Path) -> dict:
    return json.loads((run_dir / LEAKS_JSON).read_text())["c=2"]


async def test_leaking_engine_fails_the_level_naming_it(tmp_path: Path) -> None:
    programs = Programs.default()
    programs.mocker = [sys.executable, "-m", "tests.serve.leaky_engine"]
    spec = TopologySpec(fleets=[FleetSpec("aggregated", speedup=1, engine_args=fixed(5, 5),
                                          extra_sidecar_args=SIDECAR_ARGS)], grace_s=8)
    async with Stack(spec, tmp_path / "stack", programs=programs) as stack:
        check = LeakCheck(stack.processes, stack.frontend_url, stack.discovery,
                          settle_s=SETTLE_S)
        await check.baseline()
        with pytest.raises(LeakFound) as failed:
            await cancel_level(stack, check, tmp_path / "level", CancelPlan(1.0, "2tok"),
                               isl=32, osl=400)
    assert str(failed.value).startswith("c=2: leak check failed after")
    assert "engine-0: used_kv_blocks" in str(failed.value), failed.value
    level = report(tmp_path / "level")
    assert level["settled_s"] is None
    assert [leak.split(":")[0] for leak in level["leaks"]] == ["engine-0"], level


async def test_cancel_in_each_disaggregated_window(tmp_path: Path) -> None:
    spec = TopologySpec(fleets=[
        FleetSpec("prefill", speedup=1, engine_args=fixed(1000, 10),
                  extra_sidecar_args=SIDECAR_ARGS),
        FleetSpec("decode", speedup=1,
                  engine_args={**fixed(5, 10), "kv_transfer_bandwidth": 0.0052},
                  extra_sidecar_args=SIDECAR_ARGS),
    ], grace_s=8)
    # the handoff first: its window's start is the prefill pass's end, on an idle engine
    # (delay, tokens seen at least / at most, the decode worker the frontend's log names)
    windows = {"handoff": ("1800ms", 0, 0, "sidecar-decode-0"),
               "prefill": ("300ms", 0, 0, "-"),
               "decode": ("3tok", 3, 1999, "sidecar-decode-0")}
    async with Stack(spec, tmp_path / "stack") as stack:
        check = LeakCheck(stack.processes, stack.frontend_url, stack.discovery,
                          settle_s=SETTLE_S)
        await check.baseline()
        frontend_log = tmp_path / "stack" / "logs" / "frontend.log"
        seen = 0
        for window, (after, least, most, decode_worker) in windows.items():
            runner = await cancel_level(stack, check, tmp_path / window,
                                        CancelPlan(1.0, after), isl=64, osl=2000)
            level = report(tmp_path / window)
            assert level["leaks"] == [], (window, level)
            for name in ("engine-prefill-0", "engine-decode-0"):
                figures = level["figures"][name]
                assert set(figures) >= ENGINE_FIGURES, (window, name, figures)
                assert all(v == 0 for v in figures.values()), (window, name, figures)
            assert level["figures"]["frontend"]["inflight_requests"] == 0, (window, level)
            records = runner.records
            assert len(records) == 2 and all(r.cancelled for r in records), (window, records)
            assert all(least <= r.chunks <= most for r in records), (window, records)
            # the frontend's account: both requests ended by the client (499), the prefill leg
            # done and the decode leg opened (handoff, decode) or not yet (prefill)
            lines = [line for line in frontend_log.read_text().splitlines()
                     if "lab.frontend: request id=" in line]
            mine, seen = lines[seen:], len(lines)
            assert len(mine) == 2, (window, mine)
            for line in mine:
                assert "status=499" in line and "prefill_worker=sidecar-prefill-0" in line, line
                assert f"decode_worker={decode_worker} " in line, (window, line)
