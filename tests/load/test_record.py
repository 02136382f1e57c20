"""The typed request record is the row of requests.parquet: the same fields, nothing lost."""

from __future__ import annotations

import pyarrow.parquet as pq

from lab.analysis.rundir import REQUEST_COLUMNS, RequestsWriter, read_requests
from lab.load.record import STORED_FIELDS, RequestRecord, rows


def test_the_record_stores_exactly_the_schema_columns() -> None:
    assert sorted(STORED_FIELDS) == sorted(REQUEST_COLUMNS)


def test_records_round_trip_through_requests_parquet(tmp_path) -> None:
    recs = [RequestRecord(index=i, request_id=f"c1-r0-{i}", ok=True, scheduled_ns=10 + i,
                          sent_ns=20 + i, first_ns=1_000_020 + i, end_ns=3_000_020 + i,
                          chunk_times_ns=[1_000_020 + i, 3_000_020 + i], output_tokens=2,
                          chunks=2, conversation=7, turn=i, run_id="run", concurrency=1)
            for i in range(3)]
    RequestsWriter(tmp_path).append(rows(recs))
    stored = pq.read_table(tmp_path / "requests.parquet").to_pylist()
    assert [r["turn"] for r in stored] == [0, 1, 2] and {r["conversation"] for r in stored} == {7}
    assert stored[1] == recs[1].row()
    assert read_requests(tmp_path)["ttft_ms"].tolist() == [1.0, 1.0, 1.0]
