"""Deterministic tokens and UUIDs (docs/mocker.md "Tokens"), pinned and re-derived from the spec:
the words of one BLAKE3 output stream per request."""

from __future__ import annotations

import struct
import uuid

import pytest
from blake3 import blake3

from mocker.engine import (
    DEFAULT_ALLOWED_IDS,
    allowed_token_ids,
    deterministic_token_id,
    stable_request_uuid,
)
from mocker.engine.tokens import synthetic_logprob, token_deriver, token_text

# pinned from the algorithm (seed 42, request "abc"): a change of derivation must fail here
PINNED_TOKENS = [5844, 9507, 6242, 1684]
PINNED_UUID = "330a1074-346e-41c1-a2da-8c6d747dabae"


def _direct_index(seed: int, rid: str, pos: int, span: int) -> int:
    """Word `pos` of the derive-key-mode BLAKE3 output stream of seed_le8 || request id."""
    stream = blake3(derive_key_context="loadlab mocker token ids v1")
    stream.update(struct.pack("<Q", seed) + rid.encode())
    out = stream.digest(4 * (pos + 1)) if pos < 1000 else stream.digest(4, seek=4 * pos)
    return int.from_bytes(out[-4:], "little") % span


def _direct_token(seed: int, rid: str, pos: int) -> int:
    return 1000 + _direct_index(seed, rid, pos, 31000)


def test_pinned_vector() -> None:
    assert [deterministic_token_id(42, "abc", p) for p in range(4)] == PINNED_TOKENS
    assert stable_request_uuid(42, "abc") == PINNED_UUID


def test_tokens_match_a_direct_derivation() -> None:
    for seed, rid in [(42, "abc"), (0, ""), (7, "req-ü-1"), (2**64 - 1, "x" * 100)]:
        f = token_deriver(seed, rid)
        for pos in (0, 1, 2, 31, 1000, 2**40):
            want = _direct_token(seed, rid, pos)
            assert deterministic_token_id(seed, rid, pos) == want
            assert f(pos) == want
            assert 1000 <= want <= 31999
        many = f.many  # type: ignore[attr-defined]
        # within a block, across blocks, longer than a block, far out, and back again
        assert many(0, 40) == [_direct_token(seed, rid, p) for p in range(40)]
        assert many(60, 10) == [_direct_token(seed, rid, p) for p in range(60, 70)]
        assert many(0, 200) == [_direct_token(seed, rid, p) for p in range(200)]
        assert many(2**40, 3) == [_direct_token(seed, rid, p) for p in range(2**40, 2**40 + 3)]
        assert [f(p) for p in (5, 130, 2)] == [_direct_token(seed, rid, p) for p in (5, 130, 2)]


def test_uuid_matches_a_direct_derivation_with_v4_bits() -> None:
    raw = bytearray(blake3(struct.pack("<Q", 42) + b"abc").digest()[:16])
    raw[6] = (raw[6] & 0x0F) | 0x40
    raw[8] = (raw[8] & 0x3F) | 0x80
    u = uuid.UUID(stable_request_uuid(42, "abc"))
    assert u.bytes == bytes(raw)
    assert u.version == 4
    assert u.variant == uuid.RFC_4122


def test_same_seed_and_id_give_same_tokens_others_differ() -> None:
    a = [deterministic_token_id(42, "r1", p) for p in range(32)]
    assert a == [deterministic_token_id(42, "r1", p) for p in range(32)]
    assert a != [deterministic_token_id(43, "r1", p) for p in range(32)]
    assert a != [deterministic_token_id(42, "r2", p) for p in range(32)]
    assert stable_request_uuid(42, "r1") != stable_request_uuid(42, "r2")


def test_synthetic_logprob_and_text() -> None:
    assert synthetic_logprob(1000) == -0.1
    assert abs(synthetic_logprob(13659) - (-1.0)) < 1e-12
    assert token_text(1234) == "<token:1234>"


def test_an_allowed_table_picks_hash_mod_its_length() -> None:
    table = allowed_token_ids(100, excluded={0, 1, 99})
    assert table == tuple(range(2, 99))
    for seed, rid in [(42, "abc"), (7, "req-ü-1")]:
        f = token_deriver(seed, rid, table)
        for pos in (0, 1, 31, 2**40):
            want = table[_direct_index(seed, rid, pos, len(table))]
            assert f(pos) == want == deterministic_token_id(seed, rid, pos, table)
        assert f.many(5, 20) == [f(p) for p in range(5, 25)]  # type: ignore[attr-defined]
    ids = token_deriver(42, "spread", table).many(0, 2000)  # type: ignore[attr-defined]
    assert set(ids) == set(table)  # every allowed id is reachable, no other
    # the default table is the reference's id range
    assert token_deriver(42, "abc", DEFAULT_ALLOWED_IDS)(0) == PINNED_TOKENS[0]


def test_an_allowed_table_needs_an_id() -> None:
    with pytest.raises(ValueError, match="> 0"):
        allowed_token_ids(0)
    with pytest.raises(ValueError, match="no token id left"):
        allowed_token_ids(2, excluded={0, 1})
