"""What the scheduler's property tests (test_engine_property.py, test_engine_fast_forward.py)
share: their hypothesis settings, random small engines, and the operations of random workloads."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from mocker.engine import EngineArgs
from mocker.engine.config import ENGINE_TYPES

#: 300 random workloads a test, however long one takes.
PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def small_engines(
    blocks: tuple[int, int],
    budget: tuple[int, int],
    vary_chunked: bool = False,
) -> st.SearchStrategy[EngineArgs]:
    """Either engine type with 4-token blocks, `blocks` KV blocks, a `budget` of batched tokens
    (both inclusive ranges), 1 to 6 sequences, prefix caching on or off, no speed-up; chunked
    prefill on (the default), or on or off with `vary_chunked`."""
    return st.builds(
        EngineArgs,
        engine_type=st.sampled_from(ENGINE_TYPES),
        block_size=st.just(4),
        num_gpu_blocks=st.integers(*blocks),
        max_num_batched_tokens=st.integers(*budget),
        max_num_seqs=st.integers(1, 6),
        enable_prefix_caching=st.booleans(),
        enable_chunked_prefill=st.booleans() if vary_chunked else st.just(True),
        speedup_ratio=st.just(1.0),
    )


def add_ops(max_output: int, variant: st.SearchStrategy) -> st.SearchStrategy[tuple]:
    """("add", prompt length 1-40, max output 1-`max_output`, prompt family 0-2 (families share
    prefixes), a `variant` the test reads as it likes)."""
    return st.tuples(st.just("add"), st.integers(1, 40), st.integers(1, max_output),
                     st.integers(0, 2), variant)


#: ("cancel", which request): the test picks one (that may have ended, or not exist).
CANCEL_OPS = st.tuples(st.just("cancel"), st.integers(0, 30))
