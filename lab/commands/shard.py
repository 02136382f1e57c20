"""`lab sweep --target URL --shard I/N [--barrier etcd://H:P/NAME]`: one of N client pods.

Shard I of N runs every level with C/N of its C slots (C must be a multiple of N, so each
shard's share names its level) and 1/N of `--requests` (rounded up). With `--barrier` the
shards meet in etcd before the first level: each puts its wall-clock time under
`/loadlab/barrier/NAME/`, waits until all N are there, and starts at the latest of them plus
START_MARGIN_S, the same instant for all. `shard.json` in the run directory records the shard,
the level map and a (wall clock, perf counter) anchor taken at the start, from which `lab
merge` puts the shards' perf-counter stamps (one clock per node) on the shared wall clock.

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
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click

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


def shard_options(func: Callable) -> Callable:
    func = click.option(
        "--barrier-timeout", type=click.FloatRange(min=1), default=DEFAULT_BARRIER_TIMEOUT_S,
        show_default=True, metavar="SECONDS",
        help="With --barrier: how long to wait for the other shards.")(func)
    func = click.option(
        "--barrier", default=None, metavar="etcd://HOST:PORT/NAME",
        help="With --shard: meet the other shards in this etcd and start all at one "
        "wall-clock time (NAME: unique per run, e.g. the Job's uid).")(func)
    return click.option(
        "--shard", default=None, metavar="I/N",
        help="With --target: be shard I of N client processes (each runs C/N of every "
        "level's C slots and 1/N of --requests; `lab merge` joins the shards).")(func)


def sharded(concs: list[int], kw: dict[str, Any]) -> list[int]:
    """The shard's share of each level (and of kw["n_requests"], in place); unchanged without
    --shard. Usage errors name the option."""
    if kw.get("shard") is None:
        if kw.get("barrier") is not None:
            raise click.UsageError("--barrier needs --shard")
        return concs
    if not kw.get("target"):
        raise click.UsageError("--shard needs --target (the client pods of a deployed stack)")
    shard = parse_shard(kw["shard"])
    if kw.get("barrier") is not None and not _BARRIER.fullmatch(kw["barrier"]):
        raise click.BadParameter(f"{kw['barrier']!r}: expected etcd://HOST:PORT/NAME",
                                 param_hint="'--barrier'")
    bad = [c for c in concs if c % shard.count]
    if bad:
        raise click.BadParameter(f"{', '.join(map(str, bad))}: not a multiple of the "
                                 f"{shard.count} shards (each shard runs C/N slots)",
                                 param_hint="'--conc'")
    if kw.get("n_requests") is not None:
        kw["n_requests"] = math.ceil(kw["n_requests"] / shard.count)
    # distinct prompts per shard (N independent streams), deterministic for a seed
    kw["seed"] = kw.get("seed", 0) * shard.count + shard.index
    kw["_shard"] = shard
    kw["_shard_levels"] = {c // shard.count: c for c in concs}
    return [c // shard.count for c in concs]


def start(run_dir: Path, kw: dict[str, Any]) -> None:
    """Wait at the barrier (if any), then write shard.json with the clock anchor."""
    shard: Shard | None = kw.get("_shard")
    if shard is None:
        return
    barrier = None
    if kw.get("barrier"):
        barrier = wait_at_barrier(kw["barrier"], shard, kw["barrier_timeout"])
    wall_ns, mono_ns = time.time_ns(), time.perf_counter_ns()
    (run_dir / SHARD_JSON).write_text(json.dumps({
        **asdict(shard), "levels": kw["_shard_levels"], "seed": kw.get("seed"),
        "barrier": barrier,
        "anchor": {"wall_ns": wall_ns, "perf_counter_ns": mono_ns}}, indent=2) + "\n")


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
    """Arrive, wait for all shards, sleep until the common start; returns what was agreed."""
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
    delay = (start_ns - time.time_ns()) / 1e9
    if delay > 0:
        time.sleep(delay)
    return {"start_wall_ns": start_ns, "late_s": max(0.0, -delay)}
