"""EngineArgs defaults, JSON loading and validation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mocker.engine import EngineArgs
from mocker.server.config import load_engine_args


def test_defaults_match_the_reference_trtllm_engine() -> None:
    a = EngineArgs()
    assert a.engine_type == "trtllm"
    assert a.block_size == 32
    assert a.num_gpu_blocks == 16384
    assert a.max_num_seqs == 256
    assert a.max_num_batched_tokens == 8192
    assert a.enable_prefix_caching is True
    assert a.enable_chunked_prefill is True
    assert a.speedup_ratio == 1.0
    assert a.decode_speedup_ratio == 1.0
    assert a.kv_transfer_bandwidth == 64.0
    assert a.kv_bytes_per_token == 32 * 2 * 8 * 128 * 2 == 131072
    assert a.timing == {"type": "polynomial"}
    assert load_engine_args(None) == a
    assert load_engine_args("") == a
    assert load_engine_args("{}") == a


def test_vllm_block_size_defaults_to_64_unless_given() -> None:
    assert load_engine_args('{"engine_type": "vllm"}').block_size == 64
    assert load_engine_args('{"engine_type": "vllm", "block_size": 16}').block_size == 16
    assert load_engine_args('{"engine_type": "trtllm"}').block_size == 32
    assert EngineArgs(engine_type="vllm").block_size == 64
    assert EngineArgs(engine_type="vllm", block_size=0).block_size == 64
    assert EngineArgs(block_size=0).block_size == 32


def test_unknown_key_is_rejected_by_name() -> None:
    with pytest.raises(ValueError, match="bogus_knob"):
        EngineArgs.from_json({"bogus_knob": 1})
    with pytest.raises(ValueError, match="max_model_len"):
        load_engine_args('{"max_model_len": 4096}')


@pytest.mark.parametrize(
    ("obj", "field"),
    [
        ({"num_gpu_blocks": 0}, "num_gpu_blocks"),
        ({"block_size": "32"}, "block_size"),
        ({"block_size": 1}, "block_size"),
        ({"max_num_seqs": -1}, "max_num_seqs"),
        ({"max_num_batched_tokens": 1.5}, "max_num_batched_tokens"),
        ({"speedup_ratio": -1}, "speedup_ratio"),
        ({"decode_speedup_ratio": "fast"}, "decode_speedup_ratio"),
        ({"kv_transfer_bandwidth": -2}, "kv_transfer_bandwidth"),
        ({"kv_bytes_per_token": 0}, "kv_bytes_per_token"),
        ({"enable_prefix_caching": "yes"}, "enable_prefix_caching"),
        ({"engine_type": "sglang"}, "engine_type"),
        ({"timing": {"type": "magic"}}, "timing.type"),
        ({"timing": {"type": "fixed", "prefill_ms": 1}}, "timing.decode_ms"),
        ({"timing": {"type": "polynomial", "x": 1}}, "timing.x"),
        ({"timing": {"type": "profile"}}, "timing.path"),
        ({"timing": {"type": "linear", "request_after_share": 1.5}},
         "timing.request_after_share"),
        ({"timing": {"type": "linear", "request_mode": "floor", "request_after_share": 0.5}},
         "timing.request_after_share"),
    ],
)
def test_bad_values_name_the_field(obj: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        EngineArgs.from_json(obj)


def test_load_from_file_and_overrides(tmp_path: Path) -> None:
    path = tmp_path / "engine.json"
    path.write_text(json.dumps({"num_gpu_blocks": 100, "speedup_ratio": 5}))
    a = load_engine_args(str(path), speedup_ratio=0.0, decode_speedup_ratio=None)
    assert a.num_gpu_blocks == 100
    assert a.speedup_ratio == 0.0  # override wins
    assert a.decode_speedup_ratio == 1.0  # None override = not given


def test_load_errors_are_value_errors_naming_the_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"missing\.json"):
        load_engine_args(str(tmp_path / "missing.json"))
    with pytest.raises(ValueError, match="not valid JSON"):
        load_engine_args("{not json")
    bad = tmp_path / "list.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        load_engine_args(str(bad))
    with pytest.raises(ValueError, match="nope"):
        load_engine_args("{}", nope=1)


def test_args_are_frozen() -> None:
    a = EngineArgs()
    with pytest.raises(AttributeError):
        a.block_size = 8  # type: ignore[misc]
    assert a.with_overrides(block_size=8).block_size == 8


def test_first_token_decode_defaults_per_engine_type_and_must_be_a_bool() -> None:
    # off for trtllm too (docs/mocker.md "The first token under trtllm"); it was on
    assert EngineArgs.from_json({"engine_type": "trtllm"}).first_token_decode is False
    assert EngineArgs.from_json({"engine_type": "vllm"}).first_token_decode is False
    assert EngineArgs.from_json({"first_token_decode": False}).first_token_decode is False
    with pytest.raises(ValueError, match="first_token_decode must be true or false"):
        EngineArgs.from_json({"first_token_decode": 1})
