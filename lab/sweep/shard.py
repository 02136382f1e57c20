"""`lab sweep --target URL --shard I/N [--barrier etcd://H:P/NAME]`: one of N client pods.

Shard I of N runs every level with C/N of its C slots (C must be a multiple of N, so each
shard's share names its level) and 1/N of `--requests` (rounded up). With `--rate`, shard I
runs stream I of N of every rate level (`lab.load.stream_share`): the level's whole schedule
and bodies drawn from the unchanged seed, of which it sends the arrivals `split_streams` gives
it (N independent Poisson streams of rate/N; together the seed's schedule). With `--barrier` the
shards meet in etcd before the first level: each puts its wall-clock time under
`/loadlab/barrier/NAME/`, waits until all N are there, and its first level starts at the
latest of them plus START_MARGIN_S, the same instant for all (its client processes start
within that margin: `ClientSettings.start_at_ns`). `shard.json` in the run directory records
the shard, the level map and a (wall clock, perf counter) anchor taken at the start, from which
`lab merge` puts the shards' perf-counter stamps (one clock per node) on the shared wall clock.

The barrier speaks etcd's JSON gateway (kv/put, kv/range), as the discovery store does.
"""

from __future__ import annotations

import base64
import json
import math
import re
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from lab.shared.config_cli import MAX_SECONDS, Settings, setting

if TYPE_CHECKING:
    from lab.load.stream_share import StreamShare

SHARD_JSON = "shard.json"
BARRIER_PREFIX = "/loadlab/barrier/"
#: Time from the last shard's arrival to the common start: every shard sees the last key
#: within its poll interval, well inside this margin.
START_MARGIN_S = 3.0
BARRIER_POLL_S = 0.2
DEFAULT_BARRIER_TIMEOUT_S = 600.0
_SHARD = re.compile(r"(\d+)/(\d+)")
_BARRIER = re.compile(r"etcd://([^/:\s]+:\d{1,5})/([A-Za-z0-9_.\-]+)")


@dataclass(frozen=True)
class Shard:
    index: int
    count: int


def parse_shard(value: str) -> Shard:
    m = _SHARD.fullmatch(value.strip())
    if not m or not 0 <= int(m.group(1)) < int(m.group(2)):
        raise click.BadParameter(f"{value!r}: expected I/N with 0 <= I < N, e.g. 0/4",
                                 param_hint="'--shard'")
    return Shard(int(m.group(1)), int(m.group(2)))


class ShardSettings(Settings):
    """`lab sweep`'s options for one of N client pods."""

    shard: str | None = setting(
        None, "With --target: be shard I of N client processes (each runs C/N of every "
        "level's C slots and 1/N of --requests; `lab merge` joins the shards).", metavar="I/N")
    barrier: str | None = setting(
        None, "With --shard: meet the other shards in this etcd and start all at one "
        "wall-clock time (NAME: unique per run, e.g. the Job's uid).",
        metavar="etcd://HOST:PORT/NAME")
    barrier_timeout: float = setting(
        DEFAULT_BARRIER_TIMEOUT_S, "With --barrier: how long to wait for the other shards.",
        ge=1, le=MAX_SECONDS, metavar="SECONDS")


@dataclass(frozen=True)
class ShardPlan:
    """What shard I of N runs: its share of each level (share -> the level it belongs to), of
    --requests, and its own seed."""

    shard: Shard
    levels: dict[int, int]  # closed loop; empty for rate levels
    requests: int | None
    seed: int
    barrier: str | None
    barrier_timeout_s: float
    mode: str = "conc"  # "conc": C/N slots per level; "rate": stream I of N per rate level

    def share(self) -> StreamShare | None:
        """The rate levels' stream of this shard (None for closed-loop levels)."""
        from lab.load.stream_share import StreamShare  # numpy: not for `lab sweep --help`

        return StreamShare(self.shard.index, self.shard.count) if self.mode == "rate" else None


def plan_shard(settings: ShardSettings, *, target: str | None, concs: list[int],
               requests: int | None, seed: int, rate: bool = False) -> ShardPlan | None:
    """The shard's share of each level and of `requests`; None without --shard. `rate`: the
    levels are request rates (`--rate`), split into streams instead of slots. Usage errors
    name the option."""
    if settings.shard is None:
        if settings.barrier is not None:
            raise click.UsageError("--barrier needs --shard")
        return None
    if not target:
        raise click.UsageError("--shard needs --target (the client pods of a deployed stack)")
    shard = parse_shard(settings.shard)
    if settings.barrier is not None and not _BARRIER.fullmatch(settings.barrier):
        raise click.BadParameter(f"{settings.barrier!r}: expected etcd://HOST:PORT/NAME",
                                 param_hint="'--barrier'")
    if rate:
        # every shard draws the level's schedule from the same seed and sends its stream
        return ShardPlan(shard=shard, levels={}, requests=requests, seed=seed,
                         barrier=settings.barrier, barrier_timeout_s=settings.barrier_timeout,
                         mode="rate")
    bad = [c for c in concs if c % shard.count]
    if bad:
        raise click.BadParameter(f"{', '.join(map(str, bad))}: not a multiple of the "
                                 f"{shard.count} shards (each shard runs C/N slots)",
                                 param_hint="'--conc'")
    return ShardPlan(
        shard=shard, levels={c // shard.count: c for c in concs},
        requests=None if requests is None else math.ceil(requests / shard.count),
        # distinct prompts per shard (N independent streams), deterministic for a seed
        seed=seed * shard.count + shard.index,
        barrier=settings.barrier, barrier_timeout_s=settings.barrier_timeout)


def start(run_dir: Path, plan: ShardPlan | None) -> int | None:
    """Meet the others at the barrier (if any) and write shard.json with the clock anchor.

    Returns the agreed start on this node's perf_counter clock, for the first level to start
    then (`ClientSettings.start_at_ns`): the shard goes on at once, so that its client process
    starts within the barrier's margin and not after the agreed start (a client process takes
    up to a second to start on a loaded node). None without a barrier."""
    if plan is None:
        return None
    barrier = None
    start_at_ns = None
    if plan.barrier:
        barrier = wait_at_barrier(plan.barrier, plan.shard, plan.barrier_timeout_s)
        start_at_ns = time.perf_counter_ns() + int(barrier["start_wall_ns"]) - time.time_ns()
    wall_ns, mono_ns = time.time_ns(), time.perf_counter_ns()
    (run_dir / SHARD_JSON).write_text(json.dumps({
        **asdict(plan.shard), "mode": plan.mode, "levels": plan.levels, "seed": plan.seed,
        "barrier": barrier,
        "anchor": {"wall_ns": wall_ns, "perf_counter_ns": mono_ns}}, indent=2) + "\n")
    return start_at_ns


# -- the barrier --------------------------------------------------------------------------------

def _b64(data: str) -> str:
    return base64.b64encode(data.encode()).decode()


def _call(endpoint: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(f"http://{endpoint}/v3/{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        out: dict[str, Any] = json.loads(resp.read())
        return out


def wait_at_barrier(spec: str, shard: Shard, timeout_s: float) -> dict[str, Any]:
    """Arrive and wait for all shards; returns what was agreed: the common start (wall clock
    ns) and how much of the margin was left when this shard saw the last arrival."""
    m = _BARRIER.fullmatch(spec)
    assert m is not None  # checked by `sharded`
    endpoint, name = m.groups()
    prefix = f"{BARRIER_PREFIX}{name}/"
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    deadline = time.monotonic() + timeout_s
    try:
        key = _b64(f"{prefix}{shard.index}")
        # create-only: a second pod with the same index is an error, not a silent overwrite
        created = _call(endpoint, "kv/txn", {
            "compare": [{"key": key, "target": "CREATE", "result": "EQUAL",
                         "create_revision": "0"}],
            "success": [{"request_put": {
                "key": key, "value": _b64(json.dumps({"wall_ns": time.time_ns()}))}}],
        }).get("succeeded", False)
        if not created:
            raise click.ClickException(f"--barrier {spec}: shard {shard.index} already "
                                       "arrived (two clients with the same --shard?)")
        while True:
            kvs = _call(endpoint, "kv/range",
                        {"key": _b64(prefix), "range_end": _b64(end)}).get("kvs", [])
            if len(kvs) >= shard.count:
                break
            if time.monotonic() > deadline:
                raise click.ClickException(
                    f"--barrier {spec}: {len(kvs)} of {shard.count} shards arrived within "
                    f"{timeout_s:g} s")
            time.sleep(BARRIER_POLL_S)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise click.ClickException(f"--barrier {spec}: {exc}") from None
    arrivals = [json.loads(base64.b64decode(kv["value"]))["wall_ns"] for kv in kvs]
    start_ns = max(arrivals) + int(START_MARGIN_S * 1e9)
    return {"start_wall_ns": start_ns, "margin_left_s": (start_ns - time.time_ns()) / 1e9}
