"""Synthetic workload: exact lengths, determinism, shared prefix, word prompts."""

from __future__ import annotations

import pickle

import pytest

from lab.load.workload import (
    TOKEN_ID_MAX,
    TOKEN_ID_MIN,
    RequestSet,
    WorkloadSpec,
    build_requests,
)


def test_exact_isl_osl_and_flags() -> None:
    bodies = build_requests(WorkloadSpec(isl=136, osl=128), "m", 50, level_seed=1)
    for b in bodies:
        assert len(b["prompt"]) == 136
        assert all(TOKEN_ID_MIN <= t <= TOKEN_ID_MAX for t in b["prompt"])
        assert b["max_tokens"] == b["min_tokens"] == 128
        assert b["ignore_eos"] is True and b["stream"] is True
        assert b["stream_options"] == {"include_usage": True}
        assert b["nvext"] == {"extra_fields": ["worker_id"]}
        assert b["model"] == "m"


def test_deterministic_for_a_seed_and_distinct_across_levels() -> None:
    spec = WorkloadSpec(seed=3)
    a = build_requests(spec, "m", 10, level_seed=1)
    assert a == build_requests(spec, "m", 10, level_seed=1)
    assert a != build_requests(spec, "m", 10, level_seed=2)
    assert a != build_requests(WorkloadSpec(seed=4), "m", 10, level_seed=1)
    assert len({tuple(b["prompt"]) for b in a}) == 10


def test_shared_prefix() -> None:
    bodies = build_requests(WorkloadSpec(isl=100, shared_prefix=64), "m", 20, level_seed=1)
    prefixes = {tuple(b["prompt"][:64]) for b in bodies}
    assert len(prefixes) == 1
    assert len({tuple(b["prompt"][64:]) for b in bodies}) == 20
    other_level = build_requests(WorkloadSpec(isl=100, shared_prefix=64), "m", 1, level_seed=9)
    assert tuple(other_level[0]["prompt"][:64]) in prefixes


def test_stddev_clipped_and_varied() -> None:
    bodies = build_requests(WorkloadSpec(isl=5, osl=3, isl_stddev=20, osl_stddev=20), "m", 300, 1)
    isl = [len(b["prompt"]) for b in bodies]
    osl = [b["max_tokens"] for b in bodies]
    assert min(isl) >= 1 and min(osl) >= 1
    assert len(set(isl)) > 5 and len(set(osl)) > 5
    assert all(b["min_tokens"] == b["max_tokens"] for b in bodies)


def test_word_prompts_one_token_per_word() -> None:
    ids = build_requests(WorkloadSpec(isl=40), "m", 3, 1)
    words = build_requests(WorkloadSpec(isl=40, prompt_kind="words"), "m", 3, 1)
    for i, w in zip(ids, words, strict=True):
        parts = w["prompt"].split()
        assert len(parts) == 40
        assert [int(p.removeprefix("<token:").removesuffix(">")) for p in parts] == i["prompt"]


def test_chat_endpoint_uses_messages() -> None:
    (body,) = build_requests(WorkloadSpec(isl=12, endpoint="chat"), "m", 1, 1)
    assert "prompt" not in body
    assert len(body["messages"][0]["content"].split()) == 12


def test_request_set_is_lazy_and_picklable() -> None:
    rs = RequestSet(WorkloadSpec(), "m", 1, 10**9)
    assert len(rs) == 10**9
    assert rs[5] == build_requests(WorkloadSpec(), "m", 6, 1)[5]
    assert pickle.loads(pickle.dumps(rs))[7] == rs[7]
    with pytest.raises(IndexError):
        rs[10**9]


@pytest.mark.parametrize("kwargs", [{"isl": 0}, {"osl": -1}, {"isl_stddev": -1},
                                    {"shared_prefix": -2}, {"prompt_kind": "x"}])
def test_bad_spec(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        WorkloadSpec(**kwargs)
