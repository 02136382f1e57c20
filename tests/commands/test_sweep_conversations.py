"""`lab sweep --turns N` end to end over the launched stack: each turn sends the history with
the previous answer (so the server-reported prompt grows turn by turn by at least the previous
answer), records carry the conversation and the turn, and under a rate a turn follows its
predecessor's end plus the think time. Conflicting options are usage errors naming them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from click.testing import CliRunner

from lab.commands.sweep import sweep
from tests.in_process import lab
from tests.usage_errors import assert_usage_error, usage_cases

ISL, OSL, TURNS = 32, 8, 3


@usage_cases(
    ("--turns 3", "--endpoint chat"),
    ("--think-ms 5", "--turns"),
    ("--turns 2 --endpoint chat --client-procs 2", "--client-procs"),
    ("--turns 2 --endpoint chat --rate 5 --max-concurrency 2", "--max-concurrency"),
)
def test_conversation_conflicts_are_usage_errors(args: list[str], named: str) -> None:
    result = CliRunner().invoke(sweep, args)
    assert_usage_error(result.exit_code, result.output, named)


def _sweep(run: Path, *level: str) -> pd.DataFrame:
    proc = lab("sweep", "--endpoint", "chat", "--turns", str(TURNS), "--think-ms", "20",
               "--isl", str(ISL), "--osl", str(OSL), "--requests", "6", "--warmup", "0",
               "--speedup", "1000", *level, "--out", str(run), "--quiet", "--no-plots")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    req = pd.read_parquet(run / "requests.parquet")
    assert req["ok"].all(), req.loc[~req["ok"], ["error_kind", "error_message"]]
    return req.sort_values(["conversation", "turn"])


def _check_turns(req: pd.DataFrame) -> None:
    """Every conversation has turns 0..TURNS-1, and each turn's prompt holds the previous
    prompt, the previous answer and a new user message."""
    assert req["conversation"].nunique() == 6
    for _, conv in req.groupby("conversation"):
        assert conv["turn"].tolist() == list(range(TURNS))
        prompt = conv["input_tokens"].to_numpy()
        answer = conv["output_tokens"].to_numpy()
        assert (conv["input_tokens_source"] == "usage").all()
        assert (prompt[1:] >= prompt[:-1] + answer[:-1] + ISL).all(), (prompt, answer)


def test_each_turn_sends_the_history_with_the_previous_answer(tmp_path: Path) -> None:
    req = _sweep(tmp_path / "run", "--conc", "2")
    _check_turns(req)
    header = (tmp_path / "run" / "report.md").read_text().split("\n## ")[0]
    assert "conversations of 3 turns" in header, header
    # --requests counts conversations, and the header says how many requests that makes
    assert "per level: 6 conversations of 3 turns (18 requests)" in header, header
    _check_turn_table((tmp_path / "run" / "report.md").read_text(), req)
    # `lab report` rebuilds the report and prints the same table
    proc = lab("report", str(tmp_path / "run"), "--no-plots")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _check_turn_table(proc.stdout, req)


def _check_turn_table(text: str, req: pd.DataFrame) -> None:
    """The per-turn table: one row per turn at c=2, 6 requests each, the server-reported
    prompt tokens p50 of each turn (growing turn by turn), TTFT and latency."""
    assert "| Level | Turn | requests | prompt tokens p50 (server) |" in text, text
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| c=2 | ")]
    assert [r[1] for r in rows] == ["0", "1", "2"], rows
    assert [r[2] for r in rows] == ["6", "6", "6"], rows
    want = req.groupby("turn")["input_tokens"].median().round().astype(int).tolist()
    assert [int(r[3].replace(",", "")) for r in rows] == want, (rows, want)
    assert want == sorted(want) and want[0] < want[-1]
    assert all(r[4] != "-" and r[6].rstrip(" |") != "-" for r in rows), rows


def test_under_a_rate_a_turn_follows_its_predecessor(tmp_path: Path) -> None:
    req = _sweep(tmp_path / "run", "--rate", "20")
    _check_turns(req)
    for _, conv in req.groupby("conversation"):
        done = conv["done_ns"].to_numpy(dtype=np.int64)
        intended = conv["intended_ns"].to_numpy(dtype=np.int64)
        sent = conv["sent_ns"].to_numpy(dtype=np.int64)
        # meant for the previous answer's end plus the think time, and not sent before it
        assert (intended[1:] >= done[:-1] + 20_000_000).all(), (intended, done)
        assert (sent[1:] >= intended[1:]).all()
    first = req[req["turn"] == 0]["intended_ns"].to_numpy(dtype=np.int64)
    assert (np.diff(np.sort(first)) > 0).all()  # conversations arrive on the level's schedule
