"""Files of a run directory that the analysis reads and writes (docs/metrics.md, "The run
directory").

    config.json       every setting (written by the launcher; the sweep adds its section)
    requests.parquet  one row per request (REQUEST_SCHEMA: ns stamps and counts, no millisecond
                      figure), rewritten atomically after each level
    levels.csv/json   one row per level (lab.analysis.metrics)
    client.json       client-health figures per level (CPU, loop lag: not derivable from requests;
                      lab.analysis.client_health)
    procs.parquet     per-process CPU/RSS samples (the launcher's sampler)
    timeline.parquet  per level, per second: sent, completed, in flight, TTFT/ITL, errors
                      (lab.analysis.timeline)
    events.jsonl      launcher events (faults, exits, restarts, registrations)
    plots/*.png, report.md, logs/*.log
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from lab.analysis.request_times import with_request_times

REQUESTS = "requests.parquet"
LEVELS_CSV = "levels.csv"
LEVELS_JSON = "levels.json"
CLIENT_JSON = "client.json"
PROCS = "procs.parquet"
CONFIG = "config.json"
EVENTS = "events.jsonl"
REPORT = "report.md"
PLOTS = "plots"
TIMELINE = "timeline.parquet"

REQUEST_SCHEMA = pa.schema([
    ("run_id", pa.string()),
    ("concurrency", pa.int64()),
    ("repeat", pa.int64()),
    ("index", pa.int64()),
    ("request_id", pa.string()),
    ("response_id", pa.string()),
    ("warmup", pa.bool_()),
    ("ok", pa.bool_()),
    ("client_proc", pa.int64()),
    ("scheduled_ns", pa.int64()),
    ("sent_ns", pa.int64()),
    ("first_ns", pa.int64()),
    ("end_ns", pa.int64()),
    ("done_ns", pa.int64()),
    ("isl_requested", pa.int64()),
    ("osl_requested", pa.int64()),
    ("input_tokens", pa.int64()),
    ("input_tokens_source", pa.string()),
    ("output_tokens", pa.int64()),
    ("output_tokens_source", pa.string()),
    ("cached_tokens", pa.int64()),
    ("chunks", pa.int64()),
    ("tokens_per_chunk", pa.float64()),
    ("finish_reason", pa.string()),
    ("error_kind", pa.string()),
    ("error_message", pa.string()),
    ("http_status", pa.int64()),
    ("prefill_worker_id", pa.string()),
    ("decode_worker_id", pa.string()),
    ("moved_from", pa.string()),  # workers a request failed on and moved away from (comma list)
    ("chunk_times_ns", pa.list_(pa.int64())),
    # open-loop levels (docs/open-loop.md): the offered rate and the intended send time
    ("rate", pa.float64()),
    ("intended_ns", pa.int64()),
    # conversations (--turns): which conversation a request is a turn of, and which turn
    ("conversation", pa.int64()),
    ("turn", pa.int64()),
    # reasoning streams (docs/metrics.md "Reasoning"): first reasoning / answer chunk, and the
    # chunks with reasoning only
    ("first_reasoning_ns", pa.int64()),
    ("first_answer_ns", pa.int64()),
    ("reasoning_chunks", pa.int64()),
    # --cancel: the client closed the request mid-stream on purpose, and when
    ("cancelled", pa.bool_()),
    ("cancelled_ns", pa.int64()),
])
REQUEST_COLUMNS = REQUEST_SCHEMA.names


def records_table(records: list[dict]) -> pa.Table:
    """Request rows (`lab.load.record.RequestRecord.row()`) as a table with REQUEST_SCHEMA."""
    cols = {name: [r.get(name) for r in records] for name in REQUEST_COLUMNS}
    for name in ("response_id", "request_id", "prefill_worker_id", "decode_worker_id",
                 "moved_from", "finish_reason", "error_kind", "error_message", "run_id"):
        cols[name] = [None if v is None else str(v) for v in cols[name]]
    return pa.table(cols, schema=REQUEST_SCHEMA)


def _atomic_parquet(table: pa.Table, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


class RequestsWriter:
    """Keeps the run's request rows and rewrites requests.parquet atomically after each level,
    so an interrupted sweep leaves a readable file with every completed level."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / REQUESTS
        self.tables: list[pa.Table] = []

    def append(self, records: list[dict]) -> None:
        self.tables.append(records_table(records))
        _atomic_parquet(pa.concat_tables(self.tables), self.path)


def read_requests(run_dir: Path) -> pd.DataFrame:
    """requests.parquet with the derived per-request figures (`with_request_times`)."""
    return with_request_times(pd.read_parquet(Path(run_dir) / REQUESTS))


def read_procs(run_dir: Path) -> pd.DataFrame | None:
    path = Path(run_dir) / PROCS
    if not path.exists():
        return None
    try:
        return pd.read_parquet(path)
    except (OSError, ValueError):
        return None


def _clean(value: Any) -> Any:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if hasattr(value, "item"):  # numpy scalar
        return _clean(value.item())
    return value


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_clean(obj), indent=2, default=str) + "\n")
    os.replace(tmp, path)


def read_json(path: Path, default: Any = None) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return default


def write_levels(run_dir: Path, levels: pd.DataFrame) -> None:
    run_dir = Path(run_dir)
    tmp = run_dir / (LEVELS_CSV + ".tmp")
    levels.to_csv(tmp, index=False)
    os.replace(tmp, run_dir / LEVELS_CSV)
    write_json(run_dir / LEVELS_JSON, levels.to_dict(orient="records"))


def read_events(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / EVENTS
    events: list[dict] = []
    if not path.exists():
        return events
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events
