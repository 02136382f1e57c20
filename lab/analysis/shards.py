"""Join the run directories of `lab sweep --shard I/N` client pods into one run.

Each shard's stamps are its node's perf counter; its shard.json anchors that clock to the wall
clock at the shard's start, so every stamp becomes wall-clock ns (stamp + wall - perf) and the
shards' requests share one time line (as good as the nodes' clock sync, NTP: about a
millisecond, which bounds the error of a level's start and end, not of any request's own
figures, which are differences on one clock). A shard's level of C/N slots becomes the level
C it is a share of, and its request i the level's request i x N + I. A rate shard (shard.json
`mode` "rate") already records the rate level and the level's own request indices
(`lab.load.stream_share`): its rows keep them, so the merged level is the seed's schedule.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from lab.analysis import rundir

SHARD_JSON = "shard.json"  # written by lab.commands.shard
STAMP_COLUMNS = ("intended_ns", "scheduled_ns", "sent_ns", "first_ns", "end_ns", "done_ns")


class ShardError(ValueError):
    """A shard directory is missing, unreadable, or does not belong with the others."""


@dataclass(frozen=True)
class ShardRun:
    path: Path
    info: dict[str, Any]
    requests: pd.DataFrame
    config: dict[str, Any]

    @classmethod
    def read(cls, path: Path) -> ShardRun:
        try:
            info = json.loads((path / SHARD_JSON).read_text())
            requests = pd.read_parquet(path / rundir.REQUESTS)
        except (OSError, ValueError) as exc:
            raise ShardError(f"{path}: not a finished shard run ({exc})") from None
        return cls(path, info, requests, rundir.read_json(path / rundir.CONFIG, {}) or {})


def check_complete(shards: list[ShardRun]) -> int:
    """N, when the shards are exactly 0..N-1 of one N; ShardError naming the problem."""
    counts = {s.info["count"] for s in shards}
    if len(counts) != 1:
        raise ShardError(f"shards of different runs (N = {sorted(counts)})")
    (count,) = counts
    seen: dict[int, Path] = {}
    for s in shards:
        if s.info["index"] in seen:
            raise ShardError(f"shard {s.info['index']} twice: {seen[s.info['index']]} and "
                             f"{s.path}")
        seen[s.info["index"]] = s.path
    missing = sorted(set(range(count)) - set(seen))
    if missing:
        raise ShardError(f"missing shard(s) {', '.join(map(str, missing))} of {count}")
    return int(count)


def on_shared_clock(shard: ShardRun, proc_stride: int) -> pd.DataFrame:
    df = shard.requests.copy()
    anchor = shard.info["anchor"]
    offset = int(anchor["wall_ns"]) - int(anchor["perf_counter_ns"])
    for col in STAMP_COLUMNS:
        df[col] = df[col].astype("Int64") + offset
    df["chunk_times_ns"] = [None if t is None else [int(x) + offset for x in t]
                            for t in df["chunk_times_ns"]]
    index, count = int(shard.info["index"]), int(shard.info["count"])
    if shard.info.get("mode", "conc") == "conc":
        levels = {int(k): int(v) for k, v in shard.info["levels"].items()}
        df["concurrency"] = df["concurrency"].map(levels)
        df["index"] = df["index"] * count + index
    df["client_proc"] = df["client_proc"] + index * proc_stride
    return df


def merge(dirs: list[Path], out: Path) -> int:
    """Write out/requests.parquet and out/config.json from the shards; returns N."""
    shards = [ShardRun.read(Path(d)) for d in dirs]
    count = check_complete(shards)
    shards.sort(key=lambda s: s.info["index"])
    stride = 1 + max(int(s.requests["client_proc"].max()) for s in shards
                     if not s.requests.empty)
    frames = [on_shared_clock(s, stride) for s in shards]
    merged = pd.concat(frames, ignore_index=True)
    table = pa.Table.from_pandas(merged[rundir.REQUEST_COLUMNS], schema=rundir.REQUEST_SCHEMA,
                                 preserve_index=False)
    out.mkdir(parents=True, exist_ok=True)
    import pyarrow.parquet as pq

    pq.write_table(table, out / rundir.REQUESTS)
    config = dict(shards[0].config)
    modes = {s.info.get("mode", "conc") for s in shards}
    if len(modes) != 1:
        raise ShardError(f"shards of different runs (modes {sorted(modes)})")
    if modes == {"conc"}:
        sweep = dict(config.get("sweep") or {})
        sweep["concurrency"] = sorted({int(v) for s in shards for v in s.info["levels"].values()})
        config["sweep"] = sweep
    config["shards"] = [{"path": str(s.path), **s.info} for s in shards]
    rundir.write_json(out / rundir.CONFIG, config)
    return count
