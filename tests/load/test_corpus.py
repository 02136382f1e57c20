"""Prompts of exactly ISL tokens in a real HuggingFace tokenizer (--tokenizer): text and token-id
forms, ISL drawn with a stddev, a shared prefix that is the same tokens in every request,
determinism per seed, and the lab's own word forms unchanged."""

from __future__ import annotations

import multiprocessing as mp
import pickle
import random
from pathlib import Path

import pytest

from lab.load.corpus import exact_text, words_text
from lab.load.workload import RequestSet, WorkloadSpec, build_requests
from lab.shared.hf_tokenizer import TokenizerFileError, load_hf
from tests.load.small_tokenizer import make_tokenizer


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def metaspace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SentencePiece-style tokenizer (Metaspace pre-tokenizer, Unigram model)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from tests.load.small_tokenizer import _TEXT

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(_TEXT.split("\n"), trainers.UnigramTrainer(
        vocab_size=300, special_tokens=["<unk>"], unk_token="<unk>", show_progress=False))
    d = tmp_path_factory.mktemp("metaspace")
    tok.save(str(d / "tokenizer.json"))
    return d


def _count(tok: object, prompt: str | list[int]) -> int:
    if isinstance(prompt, list):
        return len(prompt)
    return len(tok.encode(prompt, add_special_tokens=False).ids)  # type: ignore[attr-defined]


@pytest.mark.parametrize("which", ["bpe", "metaspace"])
def test_exact_text_has_exactly_n_tokens(which: str, tok_dir: Path, metaspace_dir: Path) -> None:
    tok = load_hf(tok_dir if which == "bpe" else metaspace_dir)
    for n in [*range(1, 40), 64, 100, 136, 137, 255, 512, 1000]:
        for seed in range(3):
            text = exact_text(tok, n, random.Random(f"{n}/{seed}"))
            assert _count(tok, text) == n, (n, seed, text)


@pytest.mark.parametrize("kind", ["text", "token_ids"])
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_workload_prompts_are_exact_with_stddev_and_prefix(kind: str, endpoint: str,
                                                           tok_dir: Path) -> None:
    tok = load_hf(tok_dir)
    spec = WorkloadSpec(isl=120, osl=8, isl_stddev=30, shared_prefix=40, prompt_kind=kind,
                        endpoint=endpoint, tokenizer=str(tok_dir))
    rs = RequestSet(spec, "m", level_seed=7, n=60)
    lengths, prefixes = set(), set()
    for i, body in enumerate(rs):
        prompt = body["messages"][0]["content"] if endpoint == "chat" else body["prompt"]
        if endpoint == "chat" or kind == "text":
            assert isinstance(prompt, str) and "<token:" not in prompt
        else:
            assert isinstance(prompt, list) and max(prompt) < tok.get_vocab_size()
        ids = prompt if isinstance(prompt, list) else tok.encode(
            prompt, add_special_tokens=False).ids
        isl, osl = rs.requested(i)
        assert len(ids) == isl and osl == 8, (i, isl, len(ids))
        lengths.add(isl)
        if isl > 40:
            prefixes.add(tuple(ids[:40]))
    assert len(lengths) > 10  # the stddev is honoured, in tokens
    assert len(prefixes) == 1  # the shared prefix is the same 40 tokens in every request


def test_prompts_are_deterministic_per_seed_and_picklable(tok_dir: Path) -> None:
    spec = WorkloadSpec(isl=50, prompt_kind="text", tokenizer=str(tok_dir))
    a = build_requests(spec, "m", 5, level_seed=1)
    assert a == build_requests(spec, "m", 5, level_seed=1)
    assert a != build_requests(spec, "m", 5, level_seed=2)
    other = WorkloadSpec(isl=50, prompt_kind="text", tokenizer=str(tok_dir), seed=1)
    assert a != build_requests(other, "m", 5, level_seed=1)
    rs = RequestSet(spec, "m", 1, 5)
    rs[0]  # loads the tokenizer
    clone = pickle.loads(pickle.dumps(rs))
    assert list(clone) == a
    # a spawned process (the client's --client-procs children) rebuilds the same prompts
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        assert pool.apply(list, (rs,)) == a


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.parametrize("kind", ["text", "token_ids"])
def test_workloads_of_other_shapes_share_no_prompt_text(kind: str, tok_dir: Path) -> None:
    # A sweep at ISL 200 after one at ISL 50 (same seed, level, index) must not start its
    # prompts with the other's: a target's prefix cache would serve them.
    tok = load_hf(str(tok_dir))
    spec = WorkloadSpec(isl=50, osl=8, prompt_kind=kind, tokenizer=str(tok_dir))
    ids = {}
    for shape in [spec, WorkloadSpec(isl=200, osl=8, prompt_kind=kind, tokenizer=str(tok_dir)),
                  WorkloadSpec(isl=50, osl=16, prompt_kind=kind, tokenizer=str(tok_dir))]:
        bodies = build_requests(shape, "m", 4, level_seed=1)
        ids[(shape.isl, shape.osl)] = [_count_ids(tok, b["prompt"]) for b in bodies]
    base = ids[(50, 8)]
    for other in [ids[(200, 8)], ids[(50, 16)]]:
        assert all(_common_prefix(a, b) < 8 for a, b in zip(base, other, strict=True))


def _count_ids(tok: object, prompt: str | list[int]) -> list[int]:
    if isinstance(prompt, list):
        return prompt
    return tok.encode_batch_fast([prompt], add_special_tokens=False)[0].ids  # type: ignore[attr-defined]


def test_text_without_tokenizer_is_isl_words() -> None:
    spec = WorkloadSpec(isl=30, shared_prefix=10, prompt_kind="text")
    bodies = build_requests(spec, "m", 4, level_seed=1)
    prompts = [b["prompt"].split() for b in bodies]
    assert all(len(p) == 30 for p in prompts)
    assert len({tuple(p[:10]) for p in prompts}) == 1
    assert words_text(random.Random(1), 5) == words_text(random.Random(1), 5)


def test_default_forms_are_unchanged() -> None:
    # the launched stack's default stays token ids in [1000, 31999], words stay <token:N>
    (ids,) = build_requests(WorkloadSpec(isl=5), "m", 1, level_seed=3)
    (words,) = build_requests(WorkloadSpec(isl=5, prompt_kind="words"), "m", 1, level_seed=3)
    assert len(ids["prompt"]) == 5 and all(1000 <= i <= 31999 for i in ids["prompt"])
    assert words["prompt"] == " ".join(f"<token:{i}>" for i in ids["prompt"])


def test_bad_tokenizer_paths_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(TokenizerFileError, match=r"no tokenizer\.json"):
        load_hf(tmp_path)
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(TokenizerFileError, match="cannot load"):
        load_hf(bad)
    with pytest.raises(ValueError, match="words"):
        WorkloadSpec(prompt_kind="words", tokenizer=str(bad))
