"""`python -m tests.bench.replay_open_loop`: an open-loop level replayed offline on engine args
gives the figures the mocker's scheduler produces on the target's own send times."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from tests.bench.replay_open_loop import main

#: a pass costs 4 ms + 0.05 ms a token + 0.5 ms a sequence; a request waits 3 ms first
TIMING = {"type": "linear", "pass_ms": 4.0, "token_ms": 0.05, "seq_ms": 0.5,
          "request_ms": 3.0}
ISL, OSL = 100, 5
PREFILL_MS = 4.0 + ISL * 0.05 + 0.5  # the first token's pass
DECODE_MS = 4.0 + 0.05 + 0.5  # each next token's


def _side(sends_s: list[float], step_ms: float, rate: float) -> pd.DataFrame:
    """Requests of one open-loop level whose tokens came `step_ms` apart, the first 20 ms
    after the send."""
    rows = []
    for i, s in enumerate(sends_s):
        sent = int(s * 1e9)
        chunks = [sent + int((20 + k * step_ms) * 1e6) for k in range(OSL)]
        rows.append({"ok": True, "warmup": i == 0, "sent_ns": sent, "first_ns": chunks[0],
                     "end_ns": chunks[-1], "chunk_times_ns": chunks, "output_tokens": OSL,
                     "input_tokens": ISL, "isl_requested": ISL, "rate": rate})
    return pd.DataFrame(rows)


def _run(tmp_path: Path, arrival: str) -> Path:
    run = tmp_path / "run"
    for side, step in (("target", 6.0), ("lab", 5.0)):
        where = run / "repeat-1" / "poisson" / side
        where.mkdir(parents=True)
        # sends a second apart: no two requests share a pass
        _side([0.0, 1.0, 2.0, 3.0], step, 2.0).to_parquet(where / "requests.parquet")
        (where / "config.json").write_text(json.dumps({"sweep": {"arrival": arrival}}))
    return run


def test_a_level_replays_on_the_engine_args_pass_by_pass(tmp_path: Path) -> None:
    run = _run(tmp_path, "poisson")
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"timing": TIMING}))
    result = CliRunner().invoke(main, [str(run), "--engine-args", f"model={args}"])
    assert result.exit_code == 0, result.output
    rows = {line.split("|")[3].strip(): [c.strip() for c in line.split("|")[4:9]]
            for line in result.output.splitlines() if line.startswith("|") and "---" not in line}
    # the measured sides as `lab sweep` derives them: ITL = (latency - TTFT) / (tokens - 1)
    assert rows["target"][0] == "20.00" and rows["target"][2] == "6.00"
    assert rows["lab"][2].startswith("5.00 (-16.7%)")
    # the replay: the request latency, then the prompt's pass; then a decode pass a token
    ttft, itl, latency = (float(rows["replay model"][i].split()[0]) for i in (0, 2, 3))
    assert ttft == pytest.approx(3.0 + PREFILL_MS, abs=0.01)
    assert itl == pytest.approx(DECODE_MS, abs=0.01)
    assert latency == pytest.approx(3.0 + PREFILL_MS + (OSL - 1) * DECODE_MS, abs=0.01)


def test_a_trace_is_not_replayed_and_a_run_without_a_level_is_named(tmp_path: Path) -> None:
    run = _run(tmp_path, "trace")  # its prompts share prefixes the replay does not know
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"timing": TIMING}))
    result = CliRunner().invoke(main, [str(run), "--engine-args", str(args)])
    assert result.exit_code == 2
    assert f"{run}: no open-loop level with a target and a 'lab' side" in result.output
