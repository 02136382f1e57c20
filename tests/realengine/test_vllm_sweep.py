"""`lab sweep --target` against a real engine: vLLM's OpenAI server on the CPU (the session's
one server, conftest.py), the tests' random-weight model and small tokenizer. No errors, and
the server-reported token counts are exactly the requested ones."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import psutil
import pytest
from click.testing import CliRunner

from lab.commands.sweep import sweep
from tests.realengine.server import MODEL_NAME, VllmServer

ISL, OSL, REQUESTS = 136, 32, 16


# the package's first test also waits for the server to start (70-150 s on 2 cores)
@pytest.mark.timeout(420)
def test_sweep_against_vllm_is_exact(vllm_server: VllmServer, tokenizer_dir: Path,
                                     tmp_path: Path) -> None:
    out = tmp_path / "run"
    pids = vllm_server.pids()
    assert set(pids) == {"frontend", "engine", "worker"}, pids
    pid_flags = [f for name, pid in pids.items() for f in ("--server-pid", f"{name}={pid}")]
    result = CliRunner().invoke(sweep, [
        "--target", vllm_server.url, "--model", MODEL_NAME, "--tokenizer", str(tokenizer_dir),
        "--prompt-kind", "text", "--isl", str(ISL), "--osl", str(OSL), "--conc", "1,8",
        "--requests", str(REQUESTS), "--warmup", "1", "--quiet", "--no-plots",
        "--out", str(out), *pid_flags])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output, result.output
    levels = pd.read_csv(out / "levels.csv")
    assert list(levels["concurrency"]) == [1, 8] and (levels["errors"] == 0).all()
    req = pd.read_parquet(out / "requests.parquet")
    assert (~req["warmup"]).sum() == 2 * REQUESTS and req["ok"].all(), req["error_message"]
    assert (req["output_tokens_source"] == "usage").all()
    assert (req["output_tokens"] == OSL).all() and (req["input_tokens"] == ISL).all()
    # --server-pid sampled each named process on its own (nested: API server -> EngineCore ->
    # Worker); the Worker does the compute
    procs = pd.read_parquet(out / "procs.parquet")
    assert set(procs["name"]) == set(pids)
    assert procs.groupby("name")["cpu_pct"].max()["worker"] > 0
    # and how long each waited for a core (the run-queue wait, launch.sampler)
    assert procs["cpu_wait_pct"].notna().all()
    assert "worker CPU wait %" in (out / "report.md").read_text()
    health = json.loads((out / "client.json").read_text())
    assert sorted(health) == ["1/0", "8/0"] and all("resends" in h for h in health.values())
    assert psutil.pid_exists(vllm_server.pid)
