"""Cancellation over real processes, driven in process: a launched Stack (the real engines,
sidecars and frontend), the sweep's level runner with the leak check after each level, exactly
as `lab sweep --cancel` wires them (`lab.commands.sweep._launched`).

* A deliberately leaking engine (`tests.serve.leaky_engine`: a cancel leaves its KV blocks
  held) fails the level, the message naming that engine and the figure.
* Disaggregated, the client's cancel lands in each of the three windows of a request's life:
  during the prefill leg, during the handoff (the prefill leg is done, the decode leg waits
  for its KV transfer) and during decode; after each, both engines (and the sidecars, the
  frontend) are back at their idle values.

The windows are made wide by the engines' timing: a prompt is prefilled 4 tokens per 300 ms
pass, KV-transferred at 50 ms a token (131072 B at 0.0026 GB/s), then decoded in 10 ms steps;
the sidecars are told to wait that long without token progress. Each window's prompt is as long
as the window needs: 64 tokens (4.8 s of prefill) for a cancel at 300 ms, early in the prefill;
32 tokens (2.4 s of prefill, then 1.6 s of transfer) for a cancel at 3.2 s, inside the transfer
(the prefill leg has ended, the decode leg has sent no token); 8 tokens (0.6 s, then 0.4 s) for
a cancel after 3 tokens of decode. Every phase left running would hold its engine past the
check's 3 s wait: 4.5 s more of prefill, or 20 s of decode (2000 tokens).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from lab.load.cancel import CancelPlan
from lab.load.client_settings import IN_PROCESS, ClientSettings
from lab.load.sweep import SweepPlan, SweepRunner
from lab.load.workload import WorkloadSpec
from lab.sweep.leak_check import LEAKS_JSON, LeakCheck, LeakFound, after_level_check
from launch.commands import Programs
from launch.stack import Stack
from launch.topology import FleetSpec, TopologySpec

SIDECAR_ARGS = ["--grace-period", "0.5"]
ENGINE_FIGURES = {"running_requests", "queued_requests", "used_kv_blocks", "open_streams"}
SETTLE_S = 3.0
#: The sidecars wait 30 s without token progress before calling their engine stalled (2 s by
#: default, shorter than a 4.8 s prefill: the request would move to the decode worker).
PATIENT = ["--stall", "30"]
#: The prefill engine's batch budget: a 64-token prompt takes 16 passes of 300 ms.
PREFILL_CHUNK = 4
#: The decode engine's KV transfer: 50 ms a token.
KV_GBPS = 0.0026


def _cancelling(plan: CancelPlan) -> ClientSettings:
    """In-process client settings whose --cancel options are `plan`'s."""
    return IN_PROCESS.model_copy(update={"cancel": plan.fraction, "cancel_after": plan.after,
                                         "cancel_seed": plan.seed})


def fixed(prefill_ms: float, decode_ms: float) -> dict:
    return {"timing": {"type": "fixed", "prefill_ms": prefill_ms, "decode_ms": decode_ms}}


async def cancel_level(stack: Stack, check: LeakCheck, run_dir: Path, plan: CancelPlan, *,
                       isl: int, osl: int, conc: int, seed: int = 0) -> SweepRunner:
    """One level of `conc` requests at concurrency `conc`, each cancelled by `plan`, then the
    check (`seed`: the prompts', so that levels do not share a prefix cache)."""
    run_dir.mkdir()
    sweep = SweepPlan(concurrency=[conc], workload=WorkloadSpec(isl=isl, osl=osl, seed=seed),
                      requests=conc, warmup=0, client=_cancelling(plan))
    runner = SweepRunner(run_dir, stack.frontend_url, stack.model, sweep,
                         after_level=after_level_check(check, run_dir, lambda _: None))
    await runner.run()
    return runner


def report(run_dir: Path, level: str) -> dict:
    return json.loads((run_dir / LEAKS_JSON).read_text())[level]


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
                               isl=32, osl=400, conc=2)
    assert str(failed.value).startswith("c=2: leak check failed after")
    assert "engine-0: used_kv_blocks" in str(failed.value), failed.value
    level = report(tmp_path / "level", "c=2")
    assert level["settled_s"] is None
    assert [leak.split(":")[0] for leak in level["leaks"]] == ["engine-0"], level


async def test_cancel_in_each_disaggregated_window(tmp_path: Path) -> None:
    spec = TopologySpec(fleets=[
        FleetSpec("prefill", speedup=1,
                  engine_args={**fixed(300, 10), "max_num_batched_tokens": PREFILL_CHUNK},
                  extra_sidecar_args=[*SIDECAR_ARGS, *PATIENT]),
        FleetSpec("decode", speedup=1,
                  engine_args={**fixed(5, 10), "kv_transfer_bandwidth": KV_GBPS},
                  extra_sidecar_args=[*SIDECAR_ARGS, *PATIENT]),
    ], grace_s=8)
    # (cancel after, prompt tokens, tokens seen at least / at most, the decode worker the
    # frontend's log names); the handoff first: its window starts when the prefill ends, on an
    # idle engine. Decode needs no long prefill before it: a short prompt reaches it sooner.
    windows = {"handoff": ("3200ms", 32, 0, 0, "sidecar-decode-0"),
               "prefill": ("300ms", 64, 0, 0, "-"),
               "decode": ("3tok", 8, 3, 1999, "sidecar-decode-0")}
    async with Stack(spec, tmp_path / "stack") as stack:
        check = LeakCheck(stack.processes, stack.frontend_url, stack.discovery,
                          settle_s=SETTLE_S)
        await check.baseline()
        frontend_log = tmp_path / "stack" / "logs" / "frontend.log"
        seen = 0
        for seed, (window, (after, isl, least, most, decode_worker)) in enumerate(
                windows.items()):
            runner = await cancel_level(stack, check, tmp_path / window, CancelPlan(1.0, after),
                                        isl=isl, osl=2000, conc=1, seed=seed)
            level = report(tmp_path / window, "c=1")
            assert level["leaks"] == [], (window, level)
            for name in ("engine-prefill-0", "engine-decode-0"):
                figures = level["figures"][name]
                assert set(figures) >= ENGINE_FIGURES, (window, name, figures)
                assert all(v == 0 for v in figures.values()), (window, name, figures)
            assert level["figures"]["frontend"]["inflight_requests"] == 0, (window, level)
            [record] = runner.records
            assert record.cancelled and least <= record.chunks <= most, (window, record)
            # the frontend's account: the client ended it (499), the prefill leg ran and the
            # decode leg was opened (handoff, decode) or not yet (prefill)
            lines = [line for line in frontend_log.read_text().splitlines()
                     if "lab.frontend: request id=" in line]
            mine, seen = lines[seen:], len(lines)
            assert len(mine) == 1, (window, mine)
            assert "status=499" in mine[0] and "prefill_worker=sidecar-prefill-0" in mine[0]
            assert f"decode_worker={decode_worker} " in mine[0], (window, mine[0])
            assert "migrations=0" in mine[0], (window, mine[0])  # no leg moved elsewhere
