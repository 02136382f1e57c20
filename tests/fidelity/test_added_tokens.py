"""A target that counts a prompt with its BOS (vLLM's /v1/completions): `lab fidelity` finds it
from the probe's usage and launches the lab's frontends with --add-special-tokens, so both
sides compute the same prompt tokens; `lab calibrate` fits each probe on the tokens the target
computes. The target here is a lab stack whose frontend adds them."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

from lab.analysis.rundir import read_requests
from tests.fidelity.conftest import lab, lab_stack_from
from tests.load.small_tokenizer import make_tokenizer

ISL = 40


def test_fidelity_counts_the_prompt_as_a_target_that_adds_a_bos(tmp_path: Path) -> None:
    tok = make_tokenizer(tmp_path / "tok", bos=True)
    topology = tmp_path / "target.toml"
    topology.write_text(f'tokenizer = "{tok}"\nspeedup = 1.0\n'
                        'add_special_tokens = true\n')
    out, cal = tmp_path / "fid", tmp_path / "cal"
    with contextmanager(lab_stack_from)(tmp_path / "target", "--topology", str(topology)) as url:
        # short outputs (the context, prefix and overlap probes' 32, 32 and 64 by default): what
        # is asserted is the prompt tokens each probe is fitted on, not the decode fit
        calibrated = lab("calibrate", "--target", url, "--tokenizer", str(tok), "--prompt-kind",
                         "text", "--context-isl", "16,32", "--context-osl", "8",
                         "--context-requests", "2", "--overlap-osl", "16",
                         "--overlap-requests", "2", "--batch-conc", "1", "--batch-isl", "16",
                         "--batch-osl", "8", "--batch-rounds", "2", "--in-process-client",
                         "--request-after-share", "0",
                         "--no-plots", "--quiet", "--out", str(cal))
        assert calibrated.returncode == 0, calibrated.stdout + calibrated.stderr
        proc = lab("fidelity", "--target", url, "--tokenizer", str(tok), "--prompt-kind", "text",
                   "--conc", "1", "--requests", "4", "--isl", str(ISL), "--osl", "4",
                   "--speedup", "1000", "--in-process-client", "--no-plots", "--out", str(out))
        assert proc.returncode == 0, proc.stdout + proc.stderr
    for side in ("target", "lab"):
        req = read_requests(out / side)
        assert (req["input_tokens_source"] == "usage").all()
        assert (req["input_tokens"] == ISL + 1).all(), (side, req["input_tokens"].tolist())
    assert "--add-special-tokens" in (out / "fidelity.md").read_text()
    lab_topology = json.loads((out / "lab" / "config.json").read_text())["topology"]
    assert lab_topology["add_special_tokens"] is True
    config = json.loads((out / "config.json").read_text())
    assert config["fidelity"]["added_prompt_tokens"] == 1
    fit = json.loads((cal / "fit.json").read_text())
    assert fit["target_engine"]["added_prompt_tokens"] == 1
    assert {p["probe"]["added"] for p in fit["probes"]} == {1}
    fit_md = (cal / "fit.md").read_text()
    assert "1 more prompt token(s)" in fit_md
    # the knots are at the tokens computed, 17 and 33, each with its probe's TTFT
    assert "- 17 tokens: target TTFT " in fit_md and "target TTFT - ms" not in fit_md
    path_topology = json.loads((cal / "lab-path" / "stack" / "config.json").read_text())
    assert path_topology["topology"]["add_special_tokens"] is True
