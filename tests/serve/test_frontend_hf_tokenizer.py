"""`lab up --tokenizer PATH` / `lab sweep --tokenizer PATH`: the launched frontend tokenizes with
the HuggingFace tokenizer, so the lab's stack counts the same prompt tokens as a real server,
and every output token decodes to text a client counts (the mock engines' ids are not bounded by
the tokenizer's vocabulary)."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from lab.analysis.rundir import read_requests
from lab.commands.sweep import sweep
from lab.serve.tokenizer import HFTokenizer
from launch.cli import up
from launch.cli_options import spec_from_options, topology_options
from launch.commands import Programs, frontend_argv
from launch.errors import TopologyError
from launch.topology import TopologySpec
from tests.load.small_tokenizer import VOCAB_SIZE, make_tokenizer


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tokenizer(tmp_path_factory.mktemp("tok"))


def test_decode_maps_ids_outside_the_vocabulary(tok_dir: Path) -> None:
    tok = HFTokenizer(tok_dir)
    assert tok.vocab_size == VOCAB_SIZE
    for tid in (1000, 20000, 31999):  # the mocker's output ids: [1000, 32000)
        text = tok.decode([tid])
        assert text and text == tok.decode([tid % VOCAB_SIZE])


def test_tokenizer_flag_reaches_the_frontend(tok_dir: Path, tmp_path: Path) -> None:
    captured = {}

    @click.command()
    @topology_options
    def cmd(**kwargs: object) -> None:
        captured["spec"] = spec_from_options(**kwargs)

    CliRunner().invoke(cmd, ["--tokenizer", str(tok_dir)], catch_exceptions=False,
                       standalone_mode=False)
    spec = captured["spec"]
    assert spec.tokenizer == str((tok_dir / "tokenizer.json").resolve())
    argv = frontend_argv(Programs.default(), spec, "file:/tmp/d")
    assert argv[argv.index("--tokenizer") + 1] == spec.tokenizer
    # without --tokenizer the frontend keeps its word tokenizer (no flag at all)
    assert "--tokenizer" not in frontend_argv(Programs.default(), TopologySpec(), "file:/tmp/d")
    # a bad path is refused before anything starts, naming the option
    result = CliRunner().invoke(up, ["--tokenizer", str(tmp_path), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "--tokenizer" in result.output, result.output
    assert "no tokenizer.json" in result.output and "Traceback" not in result.output
    toml = tmp_path / "t.toml"
    toml.write_text(f'tokenizer = "{tmp_path / "nope"}"\n')
    with pytest.raises(TopologyError, match="tokenizer"):
        TopologySpec.from_toml(toml)


def test_launched_sweep_with_tokenizer_counts_exact_prompt_tokens(tok_dir: Path,
                                                                  tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = CliRunner().invoke(sweep, ["--tokenizer", str(tok_dir), "--conc", "1,2",
                                        "--requests", "8", "--warmup", "1", "--isl", "40",
                                        "--osl", "8", "--out", str(out), "--quiet",
                                        "--no-plots"])
    assert result.exit_code == 0, result.output
    req = read_requests(out)
    assert req["ok"].all()
    # the frontend's usage: exactly ISL prompt tokens in the tokenizer, OSL completion tokens
    assert (req["input_tokens_source"] == "usage").all() and (req["input_tokens"] == 40).all()
    assert (req["output_tokens"] == 8).all()
    assert req["ttft_ms"].notna().all()  # every output token decoded to countable text
    config = json.loads((out / "config.json").read_text())
    assert config["sweep"]["workload"]["prompt_kind"] == "text"
    assert config["topology"]["tokenizer"].endswith("tokenizer.json")
