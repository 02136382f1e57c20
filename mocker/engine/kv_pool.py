"""KV block pool with prefix caching (docs/mocker.md "KV pool").

Accounting is by block counts; only full prompt blocks have an identity:

* A full block is keyed by a chained BLAKE3 hash: ``h_i = blake3(h_{i-1} || tokens_i)`` (16
  bytes, ``h_-1 = b""``), so a key names the whole prefix up to and including that block.
* **Active** blocks are referenced by >= 1 running request: cached (hashed, refcounted) full
  blocks plus **private** blocks (partial blocks, output blocks, and prompt blocks not yet
  registered). ``used == active``; ``free == total - active`` (inactive blocks are free
  capacity: they are evicted on demand).
* Releasing the last reference of a cached block makes it **inactive**: still findable by a
  prefix lookup until evicted. Eviction takes **leaves first** (inactive blocks no other cached
  block extends), least recently released first; only then inner blocks in LRU order.
* Output (decode) blocks are never hashed: they stay private and are freed on release.
"""

from __future__ import annotations

import heapq
from array import array

from blake3 import blake3

ROOT_HASH = b""
HASH_BYTES = 16


def block_hashes(tokens: list[int], block_size: int) -> list[bytes]:
    """Chained hashes of the full blocks of `tokens` (a trailing partial block is skipped)."""
    out: list[bytes] = []
    parent = ROOT_HASH
    n_full = len(tokens) // block_size
    raw = array("q", tokens[: n_full * block_size]).tobytes()
    step = block_size * 8
    for i in range(n_full):
        h = blake3(parent)
        h.update(raw[i * step : (i + 1) * step])
        parent = h.digest(HASH_BYTES)
        out.append(parent)
    return out


class KvPool:
    """Block accounting for one engine. Methods never raise on capacity: callers check."""

    __slots__ = (
        "_children",
        "_clock",
        "_inactive",
        "_leaf_heap",
        "_parent",
        "_ref",
        "evictions",
        "private",
        "total",
    )

    def __init__(self, total_blocks: int) -> None:
        self.total = total_blocks
        self.private = 0
        self.evictions = 0
        self._ref: dict[bytes, int] = {}  # active cached blocks -> refcount
        # inactive cached blocks -> release stamp; insertion order == release order (LRU first)
        self._inactive: dict[bytes, int] = {}
        # (stamp, hash) of inactive leaves; stale entries are skipped when popped
        self._leaf_heap: list[tuple[int, bytes]] = []
        self._clock = 0
        self._parent: dict[bytes, bytes] = {}  # every cached block (active or inactive)
        self._children: dict[bytes, int] = {}  # cached blocks extending it

    # ---- counts -------------------------------------------------------------------------
    @property
    def active(self) -> int:
        return self.private + len(self._ref)

    @property
    def inactive(self) -> int:
        return len(self._inactive)

    @property
    def free(self) -> int:
        """Blocks that can be allocated now (truly free + evictable inactive)."""
        return self.total - self.private - len(self._ref)

    def is_cached(self, h: bytes) -> bool:
        return h in self._parent

    # ---- prefix lookup ------------------------------------------------------------------
    def lookup(self, hashes: list[bytes], max_blocks: int) -> tuple[int, int]:
        """(matched blocks, of which active) for the longest cached prefix of `hashes`."""
        matched = active = 0
        ref = self._ref
        parent = self._parent
        for h in hashes[:max_blocks]:
            if h in ref:
                active += 1
            elif h not in parent:
                break
            matched += 1
        return matched, active

    def acquire(self, hashes: list[bytes]) -> None:
        """Take a reference on cached blocks (all must be cached: call after `lookup`)."""
        ref = self._ref
        for h in hashes:
            n = ref.get(h)
            if n is not None:
                ref[h] = n + 1
            else:
                del self._inactive[h]
                ref[h] = 1

    def release(self, hashes: list[bytes]) -> None:
        """Drop one reference on each cached block; the last drop makes it inactive.

        Released deepest block first, so within a chain the leaf is the least recent.
        """
        ref = self._ref
        for h in reversed(hashes):
            n = ref[h] - 1
            if n:
                ref[h] = n
            else:
                del ref[h]
                self._deactivate(h)

    # ---- private blocks -----------------------------------------------------------------
    def alloc_private(self, n: int) -> bool:
        """Allocate `n` private blocks, evicting inactive ones if needed; False if no room."""
        if n <= 0:
            return True
        used = self.private + len(self._ref)
        if n > self.total - used:
            return False
        for _ in range(used + len(self._inactive) + n - self.total):
            self._evict_one()
        self.private += n
        return True

    def free_private(self, n: int) -> None:
        self.private -= n
        assert self.private >= 0, "private block count went negative"

    def register(self, h: bytes, parent: bytes) -> None:
        """A private block just became the full block `h` (child of `parent`): cache it.

        If `h` is already cached, the request shares the cached block and its private copy is
        freed (deduplication), so counts stay exact.
        """
        self.private -= 1
        ref = self._ref
        n = ref.get(h)
        if n is not None:
            ref[h] = n + 1
            return
        if h in self._parent:
            del self._inactive[h]
            ref[h] = 1
            return
        ref[h] = 1
        self._parent[h] = parent
        self._children[h] = 0
        if parent in self._children:
            self._children[parent] += 1

    # ---- eviction -----------------------------------------------------------------------
    def _deactivate(self, h: bytes) -> None:
        self._clock += 1
        self._inactive[h] = self._clock
        if not self._children.get(h):
            self._push_leaf(h, self._clock)

    def _push_leaf(self, h: bytes, stamp: int) -> None:
        heap = self._leaf_heap
        heapq.heappush(heap, (stamp, h))
        if len(heap) > 2 * len(self._inactive) + 1024:  # drop stale entries
            children = self._children
            heap[:] = [(st, x) for x, st in self._inactive.items() if not children.get(x)]
            heapq.heapify(heap)

    def _evict_one(self) -> bytes:
        """Evict the least recently released inactive leaf; if none, the LRU inactive block."""
        inactive = self._inactive
        children = self._children
        heap = self._leaf_heap
        h = None
        while heap:
            stamp, cand = heapq.heappop(heap)
            if inactive.get(cand) == stamp and not children.get(cand):
                h = cand
                break
        if h is None:
            h = next(iter(inactive))
        del inactive[h]
        self.evictions += 1
        parent = self._parent.pop(h)
        del children[h]
        if parent in children:
            # max(): a parent evicted earlier (fallback) and re-registered restarts at 0
            left = max(children[parent] - 1, 0)
            children[parent] = left
            if left == 0 and parent in inactive:
                self._push_leaf(parent, inactive[parent])
        return h

    def eviction_order(self) -> list[bytes]:
        """Hashes in the order they would be evicted (tests; does not modify the pool)."""
        clone = KvPool(self.total)
        clone._ref = dict(self._ref)
        clone._inactive = dict(self._inactive)
        clone._leaf_heap = list(self._leaf_heap)
        clone._clock = self._clock
        clone._parent = dict(self._parent)
        clone._children = dict(self._children)
        return [clone._evict_one() for _ in range(len(self._inactive))]

    def check(self) -> None:
        """Invariants (tests): counts non-negative and within the pool."""
        assert self.private >= 0
        assert all(n > 0 for n in self._ref.values())
        assert self.active + self.inactive <= self.total, (self.active, self.inactive)
        assert len(self._parent) == len(self._ref) + self.inactive
        assert not (self._ref.keys() & self._inactive.keys())
