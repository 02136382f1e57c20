"""`lab calibrate` against a real engine (the package's vLLM server on the CPU, conftest.py):
the linear pass model holds the probe figures it was fitted on, and the engine settings vLLM
publishes (its KV cache config on /metrics) reach the engine args.

The bounds are a test's, generous for a loaded 2-core machine where one probe of a few requests
can land a third off (full-suite runs: a c=8 decode step 7.3 ms against 9.3 on a quiet machine,
a c=1 step 11.3 ms against about 6) or further (a CI run at 4fe6d73: the ISL 64 overlap probe's
streams stalled 120-370 ms, tokens then arriving in bursts, and its prefill gap read 68 ms
against 8-9): the median residual within 10%, every one but the largest within 50% (a wrong
pass model is off by far more, and on many probes: the `profile` curves missed vLLM's c=32 by
40-65%; the fit's soft-L1 loss keeps one stalled probe from pulling the others). The
fit's figure on a quiet machine, with the default probes, is a benchmark (docs/fidelity.md
"Measured gaps")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fidelity.conftest import lab
from tests.realengine.server import MODEL_NAME, VllmServer

#: vLLM's pass token budget on the CPU (its OpenAI server's default there): not published
CPU_BUDGET = 2048
#: vLLM's KV block size on the CPU (published on /metrics as cache config)
CPU_BLOCK_SIZE = 128
PROBES = ("--context-isl", "64,256,1024", "--context-osl", "16", "--context-requests", "5",
          "--overlap-osl", "32", "--overlap-requests", "8", "--batch-conc", "1,8,32",
          "--batch-isl", "64", "--batch-osl", "32", "--batch-rounds", "1", "--prefix-isl", "0",
          "--max-num-batched-tokens", str(CPU_BUDGET), "--engine-type", "vllm", "--no-plots",
          "--in-process-client",
          # the linear fit is what this test holds to vLLM; which model `--timing auto` picks
          # is decided by replaying the batch probes, and three batch probes of one round each
          # on a loaded machine pick `profile` now and then (tests/fidelity/test_recovery.py
          # holds the choice on known targets; the suites against vLLM chose `linear`)
          "--timing", "linear",
          # where the request latency sits is measured on two more lab stacks; this test holds
          # the pass fit (tests/fidelity/test_recovery.py holds the placement on known targets)
          "--request-after-share", "0")
MEDIAN_TOLERANCE_PCT = 10.0
TOLERANCE_PCT = 50.0


# the package's first test also waits for the server to start (70-150 s on 2 cores)
@pytest.mark.timeout(600)
def test_calibrate_fits_vllm(vllm_server: VllmServer, tokenizer_dir: Path,
                                                tmp_path: Path) -> None:
    out = tmp_path / "cal"
    proc = lab("calibrate", "--target", vllm_server.url, "--model", MODEL_NAME,
               "--tokenizer", str(tokenizer_dir), "--prompt-kind", "text", *PROBES,
               "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    fit = json.loads((out / "fit.json").read_text())
    off = [f"{r['probe']} {r['figure']}: measured {r['measured_ms']:.2f} ms, model "
           f"{r['predicted_ms']:.2f} ms ({r['residual_pct']:+.1f}%)"
           for r in fit["linear"]["residuals"] if abs(r["residual_pct"]) > TOLERANCE_PCT]
    assert len(off) <= 1, "\n".join(off) + "\n" + (out / "fit.md").read_text()
    residuals = sorted(abs(r["residual_pct"]) for r in fit["linear"]["residuals"])
    assert residuals[len(residuals) // 2] <= MEDIAN_TOLERANCE_PCT, (out / "fit.md").read_text()
    args = json.loads((out / "engine-args.json").read_text())
    assert args["timing"]["type"] == "linear"
    assert args["max_num_batched_tokens"] == CPU_BUDGET
    assert args["block_size"] == CPU_BLOCK_SIZE and args["num_gpu_blocks"] > 0, args
    assert fit["target_engine"]["max_model_len"] == 8192
