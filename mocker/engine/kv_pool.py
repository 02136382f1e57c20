"""KV block pool with prefix caching (mocker-model.md section 2.4).

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

from array import array
from collections import OrderedDict

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
        "_inactive_inner",
        "_inactive_leaf",
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
        self._inactive_leaf: OrderedDict[bytes, None] = OrderedDict()
        self._inactive_inner: OrderedDict[bytes, None] = OrderedDict()
        self._parent: dict[bytes, bytes] = {}  # every cached block (active or inactive)
        self._children: dict[bytes, int] = {}

    # ---- counts -------------------------------------------------------------------------
    @property
    def active(self) -> int:
        return self.private + len(self._ref)

    @property
    def inactive(self) -> int:
        return len(self._inactive_leaf) + len(self._inactive_inner)

    @property
    def free(self) -> int:
        """Blocks that can be allocated now (truly free + evictable inactive)."""
        return self.total - self.private - len(self._ref)

    def is_cached(self, h: bytes) -> bool:
        return h in self._parent

    def is_active(self, h: bytes) -> bool:
        return h in self._ref

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
                self._unlink_inactive(h)
                ref[h] = 1

    def release(self, hashes: list[bytes]) -> None:
        """Drop one reference on each cached block; the last drop makes it inactive.

        Released in reverse (deepest block first) so LRU order agrees with leaves-first.
        """
        ref = self._ref
        children = self._children
        for h in reversed(hashes):
            n = ref[h] - 1
            if n:
                ref[h] = n
            else:
                del ref[h]
                if children.get(h, 0):
                    self._inactive_inner[h] = None
                else:
                    self._inactive_leaf[h] = None

    # ---- private blocks -----------------------------------------------------------------
    def alloc_private(self, n: int) -> bool:
        """Allocate `n` private blocks, evicting inactive ones if needed; False if no room."""
        if n <= 0:
            return True
        if n > self.total - self.private - len(self._ref):
            return False
        overflow = self.private + len(self._ref) + self.inactive + n - self.total
        for _ in range(overflow):
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
            self._unlink_inactive(h)
            ref[h] = 1
            return
        ref[h] = 1
        self._parent[h] = parent
        self._children[h] = 0
        if parent != ROOT_HASH and parent in self._children:
            self._children[parent] += 1
            if parent in self._inactive_leaf:  # cannot happen while a child's owner holds it
                del self._inactive_leaf[parent]
                self._inactive_inner[parent] = None

    # ---- eviction -----------------------------------------------------------------------
    def _unlink_inactive(self, h: bytes) -> None:
        if h in self._inactive_leaf:
            del self._inactive_leaf[h]
        else:
            del self._inactive_inner[h]

    def _evict_one(self) -> bytes:
        if self._inactive_leaf:
            h, _ = self._inactive_leaf.popitem(last=False)
        else:
            h, _ = self._inactive_inner.popitem(last=False)
        self.evictions += 1
        parent = self._parent.pop(h)
        del self._children[h]
        if parent in self._children:
            # max(): a parent evicted earlier (inner fallback) and re-registered restarts at 0
            left = max(self._children[parent] - 1, 0)
            self._children[parent] = left
            if left == 0 and parent in self._inactive_inner:
                del self._inactive_inner[parent]
                self._inactive_leaf[parent] = None
        return h

    def check(self) -> None:
        """Invariants (tests): counts non-negative and within the pool."""
        assert self.private >= 0
        assert all(n > 0 for n in self._ref.values())
        assert self.active + self.inactive <= self.total, (self.active, self.inactive)
        assert len(self._parent) == len(self._ref) + self.inactive
