"""`lab up --tokenizer PATH` / `lab sweep --tokenizer PATH`: the launched frontend tokenizes with
the HuggingFace tokenizer, so the lab's stack counts the same prompt tokens as a real server,
and the engines, given the same tokenizer, emit only ids of its vocabulary: every output token
decodes to its own text delta (tok/chunk 1.00). Streams decode incrementally: a byte-level token
ending inside a UTF-8 character is held back until the character completes."""

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
from launch.commands import Programs, engine_argv, frontend_argv
from launch.errors import TopologyError
from launch.topology import TopologySpec
from tests.load.small_tokenizer import VOCAB_SIZE, make_tokenizer


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tokenizer(tmp_path_factory.mktemp("tok"))


def test_an_id_outside_the_vocabulary_decodes_to_no_text(tok_dir: Path) -> None:
    tok = HFTokenizer(tok_dir)
    assert tok.vocab_size == VOCAB_SIZE
    hello = tok.encode("hello")
    for tid in (VOCAB_SIZE, 1000, 31999):  # as the tokenizers decoder does; no id mod size
        assert tok.decode([tid]) == ""
        assert tok.decode([*hello, tid]) == "hello"


TEXT = "Snow: h\u00e9llo w\u00f6rld \u2013 \u2603 \U0001f600 done"


def test_stream_decode_holds_a_partial_character_until_it_completes(tok_dir: Path) -> None:
    tok = HFTokenizer(tok_dir)
    ids = tok.encode(TEXT)
    lone = [tok.decode([i]) for i in ids]
    assert any("\ufffd" in t for t in lone)  # the text has tokens inside a UTF-8 character
    stream = tok.stream_decoder()
    deltas = [stream.step([i]) for i in ids]
    assert "".join(deltas) + stream.flush() == TEXT
    assert not any("\ufffd" in d for d in deltas)  # never a half character
    held = [i for i, d in enumerate(deltas) if d == ""]
    assert held and all("\ufffd" in lone[i] for i in held)
    # chunks of several tokens: the same text, whatever the boundaries
    for size in (2, 3, 5):
        stream = tok.stream_decoder()
        parts = [stream.step(ids[k:k + size]) for k in range(0, len(ids), size)]
        assert "".join(parts) + stream.flush() == TEXT
    # a stream that ends inside a character flushes what it has (as a one-shot decode shows it)
    cut = ids[: held[0] + 1]
    stream = tok.stream_decoder()
    text = "".join(stream.step([i]) for i in cut)
    assert text + stream.flush() == tok.decode(cut)


def test_byte_level_decoding_is_the_tokenizers_decoding_event_for_event(tok_dir: Path) -> None:
    """The byte-table decoder of a byte-level BPE gives the text `tokenizers` gives, on every id
    and on random runs of ids (lone bytes, cut characters, ids outside the vocabulary), and its
    stream decoder the same events as the incremental decoder over `tokenizers`."""
    import random

    from tokenizers import Tokenizer

    from lab.serve.tokenizer import ByteLevelDecoder, IncrementalDecoder

    tok = HFTokenizer(tok_dir)
    assert isinstance(tok.stream_decoder(), ByteLevelDecoder)
    ref = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))

    def ref_decode(ids: list[int]) -> str:
        return ref.decode(ids, skip_special_tokens=False)

    for tid in range(VOCAB_SIZE + 2):
        assert tok.decode([tid]) == ref_decode([tid]), tid
    rng = random.Random(23)
    runs = [tok.encode(TEXT)] + [
        [rng.randrange(VOCAB_SIZE + 2) for _ in range(rng.randrange(1, 40))] for _ in range(400)
    ]
    for ids in runs:
        assert tok.decode(ids) == ref_decode(ids)
        size = rng.choice([1, 1, 2, 3])
        chunks = [ids[k:k + size] for k in range(0, len(ids), size)]
        fast, slow = tok.stream_decoder(), IncrementalDecoder(ref_decode)
        assert [fast.step(c) for c in chunks] + [fast.flush()] == \
            [slow.step(c) for c in chunks] + [slow.flush()], ids


def test_tokenizer_flag_reaches_the_engines(tok_dir: Path) -> None:
    spec = TopologySpec(tokenizer=str(tok_dir / "tokenizer.json"))
    argv = engine_argv(Programs.default(), spec, spec.fleets[0], "engine-0")
    assert argv[argv.index("--tokenizer") + 1] == spec.tokenizer
    plain = TopologySpec()
    assert "--tokenizer" not in engine_argv(Programs.default(), plain, plain.fleets[0], "e-0")


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
    result = CliRunner().invoke(sweep, ["--tokenizer",
                                        str(tok_dir), "--conc", "1,2",
                                        "--requests", "8", "--warmup", "1", "--isl", "40",
                                        "--osl", "8", "--out", str(out), "--quiet",
                                        "--no-plots"])
    assert result.exit_code == 0, result.output
    req = read_requests(out)
    assert req["ok"].all()
    # the frontend's usage: exactly ISL prompt tokens in the tokenizer, OSL completion tokens
    assert (req["input_tokens_source"] == "usage").all() and (req["input_tokens"] == 40).all()
    assert (req["output_tokens"] == 8).all()
    assert req["ttft_ms"].notna().all()
    # the engines emit only ids of the tokenizer's vocabulary, each a whole piece of text:
    # every token is its own SSE event, as a streaming detokenizer shows it
    assert (req["tokens_per_chunk"] == 1.0).all() and (req["chunks"] == 8).all()
    config = json.loads((out / "config.json").read_text())
    assert config["sweep"]["workload"]["prompt_kind"] == "text"
    assert config["topology"]["tokenizer"].endswith("tokenizer.json")
