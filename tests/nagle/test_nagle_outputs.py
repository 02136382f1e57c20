"""`lab nagle`'s arms, options and run-directory outputs, without processes (synthetic records)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import click
import pandas as pd
import pytest
from click.testing import CliRunner

from lab.nagle.arms import (
    LAUNCHED_ARMS,
    external_arms,
    launched_arms,
    parse_gaps,
)
from lab.nagle.command import nagle
from lab.nagle.report import write_outputs
from lab.nagle.settings import NagleSettings
from lab.shared.settings import SocketSettings


def test_launched_arms_each_change_what_their_name_says() -> None:
    assert LAUNCHED_ARMS["control"].sockets == SocketSettings()
    assert LAUNCHED_ARMS["suspect"].sockets == SocketSettings(client_nodelay=False,
                                                              split_writes=True)
    assert LAUNCHED_ARMS["server-nodelay-off"].sockets == SocketSettings(server_nodelay=False)
    assert LAUNCHED_ARMS["http-nodelay-off"].sockets == SocketSettings(http_nodelay=False)
    assert LAUNCHED_ARMS["fresh-connection"].fresh_connection
    arms = launched_arms(["control", "suspect"], [0, 50, 500], 32)
    assert [a.name for a in arms] == ["control", "suspect", "suspect-gap-50ms",
                                      "suspect-gap-500ms"]
    assert arms[0].levels == (1, 32) and arms[2].levels == (1,) and arms[2].gap_ms == 50
    assert len(launched_arms(["all"], [0], 8)) == len(LAUNCHED_ARMS)
    with pytest.raises(click.BadParameter, match="unknown arm 'nope'"):
        launched_arms(["nope"], [0], 32)
    ext = external_arms(["all"], [100], 16)
    assert [a.name for a in ext] == ["reused", "fresh-connection", "gap-100ms", "non-streaming"]
    assert ext[0].levels == (1, 16) and not ext[-1].stream
    with pytest.raises(click.BadParameter, match="need the launched stack"):
        external_arms(["suspect"], [0], 32)
    assert parse_gaps("0, 50,500") == [0, 50, 500]
    for bad in ("x", "-5", ""):
        with pytest.raises(click.BadParameter):
            parse_gaps(bad)


MS = 1_000_000


def _record(arm: str, level: int, i: int, ttft_ms: float | None) -> dict:
    """A load-client record (stamps and counts) whose TTFT is `ttft_ms` (None: failed)."""
    sent = i * 100 * MS
    times = [] if ttft_ms is None else [sent + int(ttft_ms * MS), sent + int(ttft_ms * MS) + MS]
    return {"arm": arm, "level": level, "index": i, "ok": ttft_ms is not None, "warmup": False,
            "scheduled_ns": sent, "sent_ns": sent, "first_ns": times[0] if times else None,
            "end_ns": times[-1] if times else None, "done_ns": sent + 200 * MS,
            "chunk_times_ns": times, "chunks": len(times), "output_tokens": len(times)}


def _records(arm: str, level: int, ttfts: list[float]) -> list[dict]:
    return [_record(arm, level, i, t) for i, t in enumerate(ttfts)]


def test_outputs_of_a_reproduced_probe(tmp_path: Path) -> None:
    rng = random.Random(0)
    fast = [rng.gauss(2.0, 0.3) for _ in range(60)]
    stalled = fast[:2] + [rng.gauss(44.0, 0.5) for _ in range(58)]
    records = (
        _records("control", 1, fast) + _records("control", 8, fast)
        + _records("suspect", 1, stalled) + _records("suspect", 8, fast)
    )
    records.append({**_record("suspect", 1, 60, None), "error_kind": "timeout"})
    arms = launched_arms(["control", "suspect"], [0], 8)
    _, verdict, table = write_outputs(tmp_path, records, arms, NagleSettings(requests=60, many=8),
                                      external=False)
    assert verdict.outcome == "reproduced"
    assert "| suspect | 1 | 60 | 1 |" in table  # the failed request is counted, not sampled
    doc = json.loads((tmp_path / "nagle.json").read_text())
    assert doc["stats"]["suspect"]["levels"]["1"]["cluster_n"] == 58
    assert doc["kernel"]["delack_min_ms"] == 40.0
    stored = pd.read_parquet(tmp_path / "requests.parquet")
    assert len(stored) == 241 and "ttft_ms" not in stored  # stamps only: TTFT is derived
    report = (tmp_path / "report.md").read_text()
    assert "**reproduced: with client NODELAY off and split writes, 97%" in report
    assert "![TTFT CDF](plots/ttft_cdf.png)" in report
    assert (tmp_path / "plots" / "ttft_hist.png").stat().st_size > 0

    # re-analysis from the run directory alone, with another threshold
    res = CliRunner().invoke(nagle, ["--reanalyse", str(tmp_path), "--threshold-ms", "60"])
    assert res.exit_code == 0, res.output
    assert "not reproduced" in res.output
    doc = json.loads((tmp_path / "nagle.json").read_text())
    assert doc["threshold_ms"] == 60 and doc["verdict"]["outcome"] == "not reproduced"
    res = CliRunner().invoke(nagle, ["--reanalyse", str(tmp_path)])
    assert res.exit_code == 0 and "not reproduced: with client" in res.output  # 60 ms kept
    assert json.loads((tmp_path / "nagle.json").read_text())["threshold_ms"] == 60
    res = CliRunner().invoke(nagle, ["--reanalyse", str(tmp_path), "--threshold-ms", "30"])
    assert res.exit_code == 0 and "\nreproduced: with client" in res.output


def test_bad_options_exit_2_without_a_traceback(tmp_path: Path) -> None:
    runner = CliRunner()
    for args, needle in (
        (["--arms", "bogus"], "--arms"),
        (["--gap-ms", "a,b"], "--gap-ms"),
        (["--target", "ftp://x", "--model", "m"], "--target"),
        (["--target", "http://127.0.0.1:9"], "cannot reach"),  # --model is optional now
        (["--requests", "0"], "--requests"),
        (["--warmup", "5", "--requests", "5"], "--warmup"),
    ):
        res = runner.invoke(nagle, [*args, "--out", str(tmp_path / "o")])
        assert res.exit_code == 2, (args, res.output)
        assert needle in res.output, (args, res.output)
    assert not (tmp_path / "o").exists()
