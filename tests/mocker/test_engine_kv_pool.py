"""KV pool: chained block hashes, refcounts, inactive reuse and leaves-first eviction."""

from __future__ import annotations

from blake3 import blake3

from mocker.engine.kv_pool import ROOT_HASH, KvPool, block_hashes


def test_block_hashes_are_chained_over_full_blocks() -> None:
    hs = block_hashes(list(range(10)), 4)
    assert len(hs) == 2  # the partial third block is not hashed
    h0 = blake3(ROOT_HASH + b"".join(i.to_bytes(8, "little") for i in range(4))).digest(16)
    assert hs[0] == h0
    assert hs[1] == blake3(h0 + b"".join(i.to_bytes(8, "little") for i in range(4, 8))).digest(16)
    # same block content after a different prefix -> different key
    assert block_hashes([9, 9, 9, 9, 4, 5, 6, 7], 4)[1] != hs[1]


def store(pool: KvPool, hashes: list[bytes]) -> None:
    assert pool.alloc_private(len(hashes))
    for i, h in enumerate(hashes):
        pool.register(h, hashes[i - 1] if i else ROOT_HASH)


def test_release_keeps_blocks_reusable_and_counts_exact() -> None:
    pool = KvPool(8)
    hs = block_hashes(list(range(12)), 4)
    store(pool, hs)
    assert (pool.active, pool.free, pool.inactive) == (3, 5, 0)
    pool.acquire(hs[:2])  # a second sequence shares the first two
    assert pool.active == 3
    pool.release(hs)
    assert (pool.active, pool.inactive) == (2, 1)
    pool.release(hs[:2])
    assert (pool.active, pool.free, pool.inactive) == (0, 8, 3)
    assert pool.lookup(hs, 3) == (3, 0)
    pool.acquire(hs[:1])
    assert pool.lookup(hs, 3) == (3, 1)
    pool.check()


def test_registering_a_cached_block_deduplicates() -> None:
    pool = KvPool(8)
    hs = block_hashes(list(range(8)), 4)
    store(pool, hs)
    store(pool, hs)  # a second sequence computed the same blocks
    assert pool.active == 2
    pool.release(hs)
    pool.release(hs)
    assert (pool.active, pool.inactive) == (0, 2)


def test_eviction_takes_leaves_first_then_least_recently_released() -> None:
    pool = KvPool(8)
    chain = block_hashes(list(range(12)), 4)  # h1 <- h2 <- h3
    other = block_hashes(list(range(100, 104)), 4)  # g1 (a lone leaf)
    store(pool, chain)
    pool.release(chain)  # released h3, h2, h1 (h1 the most recent of the chain)
    store(pool, other)
    pool.release(other)  # g1 released last
    # pure LRU would evict h3, h2, h1, g1; the chain's inner blocks only become leaves as
    # their children go, and among leaves the least recently released goes first
    assert pool.eviction_order() == [chain[2], chain[1], chain[0], other[0]]
    pool2 = KvPool(8)
    store(pool2, other)
    pool2.release(other)  # g1 released first now
    store(pool2, chain)
    pool2.release(chain[2:])  # only the leaf is released...
    pool2.release(chain[:2])  # ...then the inner blocks
    assert pool2.eviction_order() == [other[0], chain[2], chain[1], chain[0]]


def test_an_inner_block_outlives_an_older_leaf() -> None:
    pool = KvPool(8)
    a = block_hashes(list(range(8)), 4)  # a1 <- a2
    b = block_hashes(list(range(50, 54)), 4)  # b1
    store(pool, a)
    store(pool, b)
    pool.release(a[:1])  # a1 becomes inactive while a2 still extends it (inner)
    pool.release(b)  # b1: a leaf, released after a1
    # a1 is least recently released but inner (a2 extends it): the leaf b1 goes first
    assert pool.eviction_order()[0] == b[0]


def test_alloc_evicts_only_what_it_needs() -> None:
    pool = KvPool(4)
    hs = block_hashes(list(range(12)), 4)
    store(pool, hs)
    pool.release(hs)
    assert pool.alloc_private(2)
    assert (pool.evictions, pool.inactive, pool.active) == (1, 2, 2)
    assert pool.lookup(hs, 3) == (2, 0)  # the leaf went
    assert not pool.alloc_private(3)
    pool.check()
