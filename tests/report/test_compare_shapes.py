"""`lab compare` states each run's load shape, refuses runs whose shapes cannot line up (a
closed loop against a rate sweep or a trace replay), warns in words when runs of one shape
differ in their load beside the levels, and overlays rate sweeps against the offered rate and
trace replays per second."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from lab.analysis.rundir import RequestsWriter
from lab.commands.compare import compare
from tests.report.test_report_rebuild import synth_run

MS = 1_000_000
WORKLOAD = {"isl": 16, "osl": 8, "endpoint": "completions", "stream": True}
TRACE = {"path": "t.jsonl", "requests": 120, "speed": 1.0, "offered_req_s": 40.0,
         "block_size": 512}


def open_run(path: Path, rates: list[float], sweep: dict, ttft_ms: float = 5.0) -> None:
    """A run directory of open-loop records: per rate, 120 requests on a constant schedule,
    each answered `ttft_ms` after its send, with `sweep` as config.json's sweep section."""
    path.mkdir(parents=True)
    writer = RequestsWriter(path)
    for rate in rates:
        gap = int(1e9 / rate)
        records = []
        for i in range(120):
            sent = int(10e9 * rate) + i * gap
            times = [sent + int((ttft_ms + k) * MS) for k in range(8)]
            records.append({
                "run_id": path.name, "concurrency": 0, "rate": rate, "repeat": 0, "index": i,
                "request_id": f"r{rate}-{i}", "warmup": False, "ok": True, "error_kind": None,
                "http_status": 200, "intended_ns": sent, "scheduled_ns": sent, "sent_ns": sent,
                "first_ns": times[0], "end_ns": times[-1], "done_ns": times[-1],
                "chunk_times_ns": times, "chunks": 8, "output_tokens": 8,
                "output_tokens_source": "usage", "input_tokens": 16, "cached_tokens": 0,
                "tokens_per_chunk": 1.0})
        writer.append(records)
    (path / "config.json").write_text(json.dumps({"sweep": {"name": path.name, **sweep}}))


def rate_sweep(rates: list[float], **extra: object) -> dict:
    return {"rates": rates, "arrival": "poisson", "workload": WORKLOAD, **extra}


def trace_sweep(**trace: object) -> dict:
    return {"rates": [40.0], "arrival": "trace", "trace": {**TRACE, **trace},
            "workload": WORKLOAD}


def _compare(*runs: Path) -> tuple[int, str]:
    result = CliRunner().invoke(compare, [str(r) for r in runs])
    return result.exit_code, result.output


def test_a_closed_loop_and_a_rate_sweep_are_refused(tmp_path: Path) -> None:
    synth_run(tmp_path / "closed", {1: 22.0, 32: 500.0})
    open_run(tmp_path / "rated", [20.0, 40.0], rate_sweep([20.0, 40.0]))
    code, out = _compare(tmp_path / "closed", tmp_path / "rated")
    assert code == 2, out
    assert "cannot compare runs of different load shapes" in out, out
    assert "closed: closed loop (its levels are requests in flight)" in out, out
    assert "rated: open loop: rates 20, 40/s, poisson arrivals (its levels are offered " \
        "request rates)" in out, out
    code, out = _compare(tmp_path / "rated", tmp_path / "closed")
    assert code == 2 and "different load shapes" in out, out


def test_a_rate_sweep_and_a_trace_are_refused(tmp_path: Path) -> None:
    open_run(tmp_path / "rated", [40.0], rate_sweep([40.0]))
    open_run(tmp_path / "replay", [40.0], trace_sweep())
    code, out = _compare(tmp_path / "rated", tmp_path / "replay")
    assert code == 2, out
    assert "replay: trace replay of t.jsonl" in out, out
    assert "(its level is the trace's own times)" in out, out


def test_rate_sweeps_compare_by_offered_rate_and_warn_of_another_arrival(tmp_path: Path
                                                                         ) -> None:
    open_run(tmp_path / "a", [20.0, 40.0], rate_sweep([20.0, 40.0]))
    open_run(tmp_path / "b", [20.0, 40.0], rate_sweep([20.0, 40.0], arrival="gamma:2"),
             ttft_ms=6.0)
    code, out = _compare(tmp_path / "a", tmp_path / "b")
    assert code == 0, out
    # each run's shape, the table by rate, and the warning naming what differs
    assert "(open loop: rates 20, 40/s, poisson arrivals)" in out, out
    assert "(open loop: rates 20, 40/s, gamma:2 arrivals)" in out, out
    assert "| 20/s |" in out and "| 40/s |" in out, out
    assert "warning: b differs from a in its load beside the levels: arrivals poisson vs " \
           "gamma:2" in out, out
    compared = tmp_path / "a" / "compare"
    for name in ("rates.png", "latency_vs_throughput.png", "ttft_cdf.png", "compare.md"):
        assert (compared / name).exists(), name
    assert "warning: b differs" in (compared / "compare.md").read_text()


def test_the_same_rate_sweep_twice_has_no_warning(tmp_path: Path) -> None:
    open_run(tmp_path / "a", [20.0], rate_sweep([20.0]))
    open_run(tmp_path / "b", [20.0], rate_sweep([20.0]))
    code, out = _compare(tmp_path / "a", tmp_path / "b")
    assert code == 0 and "warning" not in out, out


@pytest.mark.parametrize(("trace", "says"), [
    ({"speed": 2.0}, "trace speed 1.0 vs 2.0"),
    ({"path": "other.jsonl"}, "trace t.jsonl vs other.jsonl"),
])
def test_trace_replays_line_up_and_warn_of_another_trace(tmp_path: Path, trace: dict,
                                                         says: str) -> None:
    open_run(tmp_path / "a", [40.0], trace_sweep())
    open_run(tmp_path / "b", [80.0 if trace.get("speed") else 40.0], trace_sweep(**trace))
    code, out = _compare(tmp_path / "a", tmp_path / "b")
    assert code == 0, out
    assert "| trace |" in out, out  # the two replays line up, whatever their rates
    assert says in out, out
    assert (tmp_path / "a" / "compare" / "timelines.png").exists()
