"""`lab sweep --shard/--barrier` and `lab merge`: bad input is one line naming it (nothing
is started, nothing is written)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from lab.cli import main


@pytest.mark.parametrize(("args", "named"), [
    (["--shard", "0/2"], "--target"),
    (["--target", "http://127.0.0.1:1", "--shard", "2/2"], "--shard"),
    (["--target", "http://127.0.0.1:1", "--shard", "x"], "--shard"),
    (["--target", "http://127.0.0.1:1", "--shard", "0/2", "--conc", "2,3"], "--conc"),
    (["--target", "http://127.0.0.1:1", "--shard", "0/2", "--conc", "2",
      "--barrier", "http://h:1/x"], "--barrier"),
    (["--target", "http://127.0.0.1:1", "--barrier", "etcd://h:1/x"], "--shard"),
    (["--target", "http://127.0.0.1:1", "--shard", "0/2", "--rate", "auto"], "--rate auto"),
    (["--target", "http://127.0.0.1:1", "--shard", "0/2", "--rate", "10",
      "--max-concurrency", "4"], "--max-concurrency"),
    (["--target", "http://127.0.0.1:1", "--shard", "0/2", "--endpoint", "chat",
      "--turns", "2"], "--turns"),
])
def test_sweep_shard_usage_errors(tmp_path: Path, args: list[str], named: str) -> None:
    result = CliRunner().invoke(main, ["sweep", *args, "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert named in result.output, result.output
    assert not (tmp_path / "o").exists()


def _fake_shard(path: Path, index: int, count: int) -> Path:
    path.mkdir(parents=True)
    (path / "shard.json").write_text(json.dumps({
        "index": index, "count": count, "levels": {"1": count},
        "anchor": {"wall_ns": 0, "perf_counter_ns": 0}}))
    pd.DataFrame({"concurrency": [1]}).to_parquet(path / "requests.parquet")
    return path


def test_merge_names_a_missing_or_doubled_shard(tmp_path: Path) -> None:
    a = _fake_shard(tmp_path / "a", 0, 3)
    b = _fake_shard(tmp_path / "b", 2, 3)
    c = _fake_shard(tmp_path / "c", 2, 3)
    result = CliRunner().invoke(main, ["merge", str(a), str(b), "--out", str(tmp_path / "m")])
    assert result.exit_code == 2 and "missing shard(s) 1 of 3" in result.output, result.output
    result = CliRunner().invoke(main, ["merge", str(a), str(b), str(c), "--out",
                                       str(tmp_path / "m")])
    assert result.exit_code == 2 and "shard 2 twice" in result.output, result.output
    result = CliRunner().invoke(main, ["merge", str(tmp_path), "--out", str(tmp_path / "m")])
    assert result.exit_code == 2 and "not a finished shard run" in result.output, result.output
    assert "Traceback" not in result.output
