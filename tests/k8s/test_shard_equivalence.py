"""N shard runs merged are one client's run: the same request count, the same requests, and the
same percentiles within noise, closed loop (`--conc`) and open loop (`--rate`).

Real processes: the fake SSE server (`tests.bench.fake_sse`, one chunk per token every 2 ms), one
unsharded `lab sweep --target` (in the test's process, its load client a child process), then 3
`lab sweep --shard I/3` processes started together that meet at an etcd barrier
(`launch.etcd.LocalEtcd`, Debian's etcd-server), and `lab merge`. The unsharded run and the
shards never run at the same time, so each meets the server alone.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from lab.commands.merge import merge
from lab.open_loop.arrivals import ArrivalProcess, schedule_seed
from launch.etcd import LocalEtcd, etcd_available
from tests.in_process import lab
from tests.procs import LAB_ARGV, Proc

pytestmark = pytest.mark.skipif(not etcd_available()[0],
                                reason="needs etcd on PATH (apt-get install -y etcd-server)")
SHARDS = 3
REQUESTS = 60
RATE = 40.0
SEED = 0  # `lab sweep --seed`'s default
#: Per-request figures of two runs on a loaded 2-core machine: a percentile agrees within this
#: fraction, or this many ms (the fake server's 2 ms token interval is the figures' floor).
REL_TOLERANCE = 0.5
ABS_TOLERANCE_MS = 4.0
#: Each shard's first rate level starts within this after the barrier's agreed start (its
#: client process starts within the barrier's margin; a loaded machine may still delay it).
START_SKEW_NS = 250_000_000
CLOCK_READS_NS = 1_000_000


def _finish(procs: list[Proc], timeout_s: float = 150) -> None:
    """Wait until every process exits; the first failure fails the test with its log."""
    deadline = time.monotonic() + timeout_s
    while any(p.popen.poll() is None for p in procs):
        failed = [p for p in procs if p.popen.poll() not in (None, 0)]
        assert not failed, failed[0].log()[-3000:]
        assert time.monotonic() < deadline, "the client runs did not finish in time"
        time.sleep(0.1)
    assert [p.popen.returncode for p in procs] == [0] * len(procs), \
        [p.log()[-2000:] for p in procs]


def _measured(run: Path) -> pd.DataFrame:
    req = pd.read_parquet(run / "requests.parquet")
    return req[~req["warmup"]].sort_values("index").reset_index(drop=True)


def _level(run: Path) -> dict:
    (level,) = json.loads((run / "levels.json").read_text())
    return dict(level)


def _wall_offset(info: dict) -> int:
    """A shard's perf_counter stamp + this = its wall-clock time (its shard.json anchor)."""
    return int(info["anchor"]["wall_ns"]) - int(info["anchor"]["perf_counter_ns"])


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= max(REL_TOLERANCE * max(a, b), ABS_TOLERANCE_MS)


async def _shards(spawn: Callable[..., Proc], etcd_dir: Path, sweep: list[str],
                  dirs: list[Path]) -> None:
    """The shards, started together as processes, meeting at an etcd barrier."""
    async with LocalEtcd(etcd_dir) as etcd:
        _finish([spawn(f"shard-{i}", [*LAB_ARGV, *sweep, "--shard", f"{i}/{SHARDS}",
                                      "--barrier", f"{etcd.spec}/equivalence", "--out", str(d)],
                       ready=False) for i, d in enumerate(dirs)])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["conc", "rate"])
def test_merged_shards_are_one_client(mode: str, spawn: Callable[..., Proc],
                                      tmp_path: Path) -> None:
    server = spawn("fake", ["python", "-m", "tests.bench.fake_sse", "--token-interval-ms", "2"])
    level = ["--conc", str(SHARDS)] if mode == "conc" else ["--rate", f"{RATE:g}"]
    sweep = ["sweep", "--target", f"http://{server.address}", "--model", "fake",
             "--isl", "16", "--osl", "8", "--requests", str(REQUESTS), "--warmup", "0",
             "--timeout", "30", "--quiet", "--no-plots", *level]
    one = tmp_path / "one"
    # The one client's sweep in this process (tests/in_process.py: no new interpreter to
    # import); its load client is a child process all the same, as each shard's is.
    ran = lab(*sweep, "--out", str(one))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    dirs = [tmp_path / f"shard-{i}" for i in range(SHARDS)]
    asyncio.run(_shards(spawn, tmp_path / "etcd", sweep, dirs))
    merged = tmp_path / "merged"
    result = CliRunner().invoke(merge, [*map(str, dirs), "--out", str(merged), "--no-plots"])
    assert result.exit_code == 0, result.output

    a, b = _measured(one), _measured(merged)
    # the same requests: as many, the same level indices, every one served
    assert len(a) == len(b) == REQUESTS
    assert a["index"].tolist() == b["index"].tolist() == list(range(REQUESTS))
    for req in (a, b):
        assert req["ok"].all(), req.loc[~req["ok"], ["error_kind", "error_message"]]
        assert (req["output_tokens"] == 8).all()
    shard_rows = [_measured(d) for d in dirs]
    if mode == "conc":
        assert set(b["concurrency"]) == {SHARDS}
        assert all(set(s["concurrency"]) == {1} for s in shard_rows)
        # each shard sent its first request at the barrier's agreed start
        for d in dirs:
            info = json.loads((d / "shard.json").read_text())
            first = int(_measured(d)["sent_ns"].min()) + _wall_offset(info)
            late = first - int(info["barrier"]["start_wall_ns"])
            print(f"{d.name}: first request {late / 1e6:.1f} ms after the agreed start")
            assert -CLOCK_READS_NS < late < START_SKEW_NS, late
    else:
        # the seed's schedule, request for request: the same bodies' lengths and, per shard,
        # the intended times of the level's schedule from that shard's start
        assert set(b["rate"]) == {RATE} and set(b["concurrency"]) == {0}
        cols = ["isl_requested", "osl_requested"]
        assert a[cols].equals(b[cols])
        offsets = ArrivalProcess().schedule_ns(RATE, REQUESTS, schedule_seed(SEED, RATE, 0))
        starts = []
        for s in shard_rows:
            assert 0 < len(s) < REQUESTS  # a share of the level, not all of it
            start = s["intended_ns"].to_numpy() - offsets[s["index"].to_numpy()]
            assert len(set(start.tolist())) == 1, "a shard's intended times are not the schedule"
            starts.append(int(start[0]))
        assert sum(len(s) for s in shard_rows) == REQUESTS
        # each shard's level started within the skew of the barrier's agreed start
        for d in dirs:
            info = json.loads((d / "shard.json").read_text())
            rows = pd.read_parquet(d / "requests.parquet")
            level_start = (int((rows["intended_ns"] - offsets[rows["index"]]).iloc[0])
                           + _wall_offset(info))
            late = level_start - int(info["barrier"]["start_wall_ns"])
            print(f"{d.name}: level start {late / 1e6:.1f} ms after the agreed start")
            # (the agreed start reaches the perf clock through one read of each clock:
            # microseconds early or late)
            assert -CLOCK_READS_NS < late < START_SKEW_NS, late
        # merged (wall clock): the level's schedule from one start, within the shards' skew
        skew = b["intended_ns"].to_numpy() - offsets[b["index"].to_numpy()]
        assert int(skew.max() - skew.min()) < START_SKEW_NS
        one_start = a["intended_ns"].to_numpy() - offsets[a["index"].to_numpy()]
        assert len(set(one_start.tolist())) == 1
        # every stamp on one clock: released at or after the intended time, never held (no
        # cap), as in the one client
        for req in (a, b):
            held = req["scheduled_ns"] - req["intended_ns"]
            assert (held >= 0).all() and held.max() < START_SKEW_NS, held.describe()
    # the same percentiles, within noise
    la, lb = _level(one), _level(merged)
    assert la["requests"] == lb["requests"] == REQUESTS, (la, lb)
    for key in ("ttft_ms_p50", "ttft_ms_p90", "latency_ms_p50", "latency_ms_p90"):
        assert _close(la[key], lb[key]), (key, la[key], lb[key])
    if mode == "rate":
        # the merged schedule's own rate is the one client's (the same intended gaps, but for
        # the shards' start skew)
        assert _close(la["schedule_req_s"], lb["schedule_req_s"])
    np.testing.assert_array_equal(np.sort(b["client_proc"].unique()).size, SHARDS)
    # the client's own health: one level, all the shards' processes and CPU, its send delay
    # from the merged requests
    shard_clients = [json.loads((d / "client.json").read_text()) for d in dirs]
    (key,) = json.loads((one / "client.json").read_text())
    (health,) = json.loads((merged / "client.json").read_text()).items()
    assert health[0] == key
    assert health[1]["procs"] == SHARDS
    assert health[1]["cpu_s"] == pytest.approx(sum(v["cpu_s"] for c in shard_clients
                                                   for v in c.values()))
    assert health[1]["send_delay_p99_ms"] is not None
    assert health[1]["cpu_ms_per_request"] == pytest.approx(1000 * health[1]["cpu_s"] / REQUESTS)
