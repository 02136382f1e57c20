"""`mocker serve --tokenizer DIR` / `--vocab-size N` as real processes: every id a Generate
stream carries is in the vocabulary, never a special token, and stop tokens still end a stream."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from lab.wire.gen.openengine.v1 import generation_pb2 as g
from lab.wire.gen.openengine.v1 import openengine_pb2_grpc
from tests.load.small_tokenizer import SPECIAL, VOCAB_SIZE, make_tokenizer
from tests.mocker.test_server_support import mocker_argv, request, tokens_of

#: Enough output that ids outside a small vocabulary would show up many times over.
N_TOKENS = 400


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tokenizer(tmp_path_factory.mktemp("tok"))


def generate(address: str, req: g.GenerateRequest) -> list[g.GenerateResponse]:
    with grpc.insecure_channel(address) as ch:
        return list(openengine_pb2_grpc.InferenceStub(ch).Generate(req, timeout=30))


def special_ids(tok_dir: Path) -> set[int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    return {tok.token_to_id(s) for s in SPECIAL}


def test_tokenizer_vocabulary_bounds_every_id(spawn, tok_dir: Path) -> None:
    specials = special_ids(tok_dir)
    proc = spawn("engine-tok", mocker_argv("--tokenizer", str(tok_dir), "--speedup-ratio", "0"))
    # the special tokens are stop tokens here: still never drawn, so the stream runs to the end
    out = generate(proc.address, request("v-1", max_tokens=N_TOKENS, stop_ids=tuple(specials)))
    ids = tokens_of(out)
    assert len(ids) == N_TOKENS and out[-1].finished.reason == g.FINISH_REASON_LENGTH
    assert all(0 <= i < VOCAB_SIZE for i in ids), max(ids)
    assert not specials & set(ids)
    assert len(set(ids)) > 100  # spread over the vocabulary, not a handful of ids
    # deterministic: the same request id gives the same ids
    assert tokens_of(generate(proc.address, request("v-1", max_tokens=N_TOKENS))) == ids
    # an in-vocabulary stop token still ends the stream where it is drawn (and is not streamed)
    stop = ids[10]
    first = ids.index(stop)
    out = generate(proc.address, request("v-1", max_tokens=N_TOKENS, stop_ids=(stop,)))
    assert tokens_of(out) == ids[:first]
    assert out[-1].finished.reason == g.FINISH_REASON_STOP
    assert out[-1].finished.stop_match.stop_token_id == stop


def test_vocab_size_bounds_every_id(spawn) -> None:
    proc = spawn("engine-vs", mocker_argv("--vocab-size", "64", "--speedup-ratio", "0"))
    ids = tokens_of(generate(proc.address, request("vs-1", max_tokens=N_TOKENS)))
    assert len(ids) == N_TOKENS and all(0 <= i < 64 for i in ids)
    assert len(set(ids)) > 50


def test_without_a_vocabulary_ids_stay_in_the_default_range(spawn) -> None:
    proc = spawn("engine-def", mocker_argv("--speedup-ratio", "0"))
    ids = tokens_of(generate(proc.address, request("d-1", max_tokens=N_TOKENS)))
    assert all(1000 <= i <= 31999 for i in ids) and max(ids) >= VOCAB_SIZE


def test_the_tokenizer_table_leaves_out_specials_and_partial_characters(tok_dir: Path) -> None:
    from tokenizers import Tokenizer

    from mocker.server.vocab import allowed_ids

    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    table = allowed_ids(str(tok_dir), 0)
    texts = {i: tok.decode([i], skip_special_tokens=False) for i in range(VOCAB_SIZE)}
    partial = {i for i, t in texts.items() if "\ufffd" in t}
    assert partial  # a byte-level vocabulary has pieces of UTF-8 characters
    assert set(table) == set(range(VOCAB_SIZE)) - partial - special_ids(tok_dir)
    with pytest.raises(ValueError, match="not both"):
        allowed_ids(str(tok_dir), 10)
