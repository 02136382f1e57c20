"""Join the run directories of `lab sweep --shard I/N` client pods into one run.

Each shard's stamps are its node's perf counter; its shard.json anchors that clock to the wall
clock at the shard's start, so every stamp becomes wall-clock ns (stamp + wall - perf) and the
shards' requests share one time line (as good as the nodes' clock sync, NTP: about a
millisecond, which bounds the error of a level's start and end, not of any request's own
figures, which are differences on one clock). A shard's level of C/N slots becomes the level
C it is a share of, and its request i the level's request i x N + I. A rate shard (shard.json
`mode` "rate") already records the rate level and the level's own request indices
(`lab.load.stream_share`): its rows keep them, so the merged level is the seed's schedule.

client.json (the client's own health per level) is merged from the shards' figures: CPU and
process counts add up, the window spans the shards' (on the wall clock), the send delay is
recomputed from the merged requests, and the event-loop lag is the worst shard's (a shard keeps
its lag percentiles, not its samples).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from lab.analysis import rundir
from lab.analysis.levels import level_key
from lab.analysis.stats import describe, measured

SHARD_JSON = "shard.json"  # written by lab.sweep.shard
STAMP_COLUMNS = ("intended_ns", "scheduled_ns", "sent_ns", "first_ns", "end_ns", "done_ns")


#: client.json list fields of client processes on Ray nodes: concatenated over the shards.
_PER_PROC_LISTS = ("clock_offsets_ns", "nodes", "lost")


class ShardError(ValueError):
    """A shard directory is missing, unreadable, or does not belong with the others."""


@dataclass(frozen=True)
class ShardRun:
    path: Path
    info: dict[str, Any]
    requests: pd.DataFrame
    config: dict[str, Any]
    clients: dict[str, Any]

    @classmethod
    def read(cls, path: Path) -> ShardRun:
        try:
            info = json.loads((path / SHARD_JSON).read_text())
            requests = pd.read_parquet(path / rundir.REQUESTS)
        except (OSError, ValueError) as exc:
            raise ShardError(f"{path}: not a finished shard run ({exc})") from None
        return cls(path, info, requests, rundir.read_json(path / rundir.CONFIG, {}) or {},
                   rundir.read_json(path / rundir.CLIENT_JSON, {}) or {})


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
    offset = _wall_offset(shard)
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


def merged_key(shard: ShardRun, key: str) -> str:
    """A shard's client.json level key ('C/R' of its C/N slots, or 'rate=X/R') in the merged
    run: the level C it is a share of; a rate level's key is already the whole level's."""
    level, repeat = key.split("/")
    if shard.info.get("mode", "conc") == "conc" and not level.startswith("rate="):
        return level_key(int(shard.info["levels"][level]), int(repeat))
    return key


def merge_clients(shards: list[ShardRun], requests: pd.DataFrame) -> dict[str, Any]:
    """The merged run's client.json; `requests`: the merged requests with their derived
    figures (`rundir.read_requests`)."""
    parts: dict[str, list[tuple[ShardRun, dict[str, Any]]]] = {}
    for shard in shards:
        for key, figures in shard.clients.items():
            parts.setdefault(merged_key(shard, key), []).append((shard, figures))
    rated = "rate" in requests and requests["rate"].notna().any()
    keys = [level_key(int(row.concurrency), int(row.repeat), row.rate if rated else None)
            for row in requests[["concurrency", "rate", "repeat"]].itertuples()]
    by_level = requests.groupby(pd.Series(keys, index=requests.index))
    merged: dict[str, Any] = {}
    for key, pieces in parts.items():
        level = by_level.get_group(key) if key in by_level.groups else requests.iloc[:0]
        started = min(h["started_ns"] + _wall_offset(s) for s, h in pieces)
        ended = max(h["ended_ns"] + _wall_offset(s) for s, h in pieces)
        wall_s = max((ended - started) / 1e9, 1e-9)
        cpu_s = sum(h["cpu_s"] for _, h in pieces)
        send = describe(measured(level)["send_delay_ms"]) if len(level) else describe([])
        health: dict[str, Any] = {
            "procs": sum(h["procs"] for _, h in pieces),
            "started_ns": started,
            "ended_ns": ended,
            "wall_s": wall_s,
            "cpu_s": cpu_s,
            "cpu_pct": 100.0 * cpu_s / wall_s,
            "cpu_pct_max_proc": _max(h.get("cpu_pct_max_proc") for _, h in pieces),
            "cpu_ms_per_request": 1000.0 * cpu_s / len(level) if len(level) else None,
            "send_delay_p99_ms": send["p99"],
            "send_delay_max_ms": send["max"],
            "loop_lag_p99_ms": _max(h.get("loop_lag_p99_ms") for _, h in pieces),
            "loop_lag_max_ms": _max(h.get("loop_lag_max_ms") for _, h in pieces),
            "resends": sum(h.get("resends", 0) for _, h in pieces),
        }
        if any("clock_offsets_ns" in h for _, h in pieces):
            for name in _PER_PROC_LISTS:
                health[name] = [v for _, h in pieces for v in h.get(name, [])]
            health["clock_error_ns_max"] = _max(h.get("clock_error_ns_max") for _, h in pieces)
        merged[key] = health
    return merged


def _wall_offset(shard: ShardRun) -> int:
    """A shard's perf_counter stamp + this = its wall-clock time (shard.json's anchor)."""
    anchor = shard.info["anchor"]
    return int(anchor["wall_ns"]) - int(anchor["perf_counter_ns"])


def _max(values: Any) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def merge(dirs: list[Path], out: Path) -> int:
    """Write out/requests.parquet, client.json and config.json from the shards; returns N."""
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
    rundir.write_json(out / rundir.CLIENT_JSON, merge_clients(shards, rundir.read_requests(out)))
    rundir.write_json(out / rundir.CONFIG, config)
    return count
