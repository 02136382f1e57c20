"""`Scheduler.fast_forward` is exactly a run of `step` calls, only cheaper.

Two schedulers get the same random workload; one only ever calls `step`, the other calls
`fast_forward` first and `step` when it ran nothing. After every operation their tokens,
metrics, KV pool and clocks must be identical.
"""

from __future__ import annotations

from dataclasses import asdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mocker.engine import EngineArgs, EngineRequest, Scheduler
from mocker.engine.tokens import token_deriver

advance = st.tuples(
    st.just("advance"),
    st.integers(1, 80),  # max tokens of the fast-forward
    st.sampled_from([0.0, 0.5, 3.0, 40.0, float("inf")]),  # horizon past now (ms)
)
op = st.one_of(
    advance,
    advance,
    advance,
    st.tuples(
        st.just("add"),
        st.integers(1, 40),  # prompt length
        st.integers(1, 40),  # max output
        st.integers(0, 2),  # prompt family (shared prefixes)
        st.booleans(),  # handoff (kv transferred, first position 1)
    ),
    st.tuples(st.just("cancel"), st.integers(0, 30)),
)


def _request(i: int, plen: int, max_out: int, family: int, handoff: bool) -> EngineRequest:
    key = f"r{i}"
    prompt = [family * 100 + j % 7 for j in range(plen)]
    return EngineRequest(
        key,
        prompt,
        max_out,
        token_deriver(7, key),
        first_position=1 if handoff else 0,
        kv_transferred=handoff,
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    engine_type=st.sampled_from(["trtllm", "vllm"]),
    blocks=st.integers(6, 40),
    budget=st.integers(2, 64),
    seqs=st.integers(1, 6),
    caching=st.booleans(),
    ops=st.lists(op, min_size=20, max_size=60),
)
def test_fast_forward_equals_repeated_steps(
    engine_type: str, blocks: int, budget: int, seqs: int, caching: bool, ops: list[tuple]
) -> None:
    args = EngineArgs.from_json(
        {
            "engine_type": engine_type,
            "block_size": 4,
            "num_gpu_blocks": blocks,
            "max_num_batched_tokens": budget,
            "max_num_seqs": seqs,
            "enable_prefix_caching": caching,
            "speedup_ratio": 1.0,
        }
    )
    ref, fast = Scheduler(args), Scheduler(args)
    ref_tokens: dict[str, list[int]] = {}
    fast_tokens: dict[str, list[int]] = {}
    t_ref = t_fast = 0.0
    added = 0
    fast_forwarded = 0

    def record(tokens: dict[str, list[int]], key: str, token: int | None) -> None:
        if token is not None:
            tokens.setdefault(key, []).append(token)

    def ref_step() -> None:
        nonlocal t_ref
        res = ref.step(t_ref)
        for s in res.signals:
            record(ref_tokens, s.key, s.token_id)
        t_ref += res.duration_ms

    for o in ops:
        if o[0] == "add":
            for s in (ref, fast):
                s.add(_request(added, *o[1:]))
            added += 1
        elif o[0] == "cancel":
            key = f"r{o[1]}"
            assert ref.cancel(key) == fast.cancel(key)
        else:
            _, max_tokens, horizon = o
            burst = fast.fast_forward(t_fast, t_fast + horizon, max_tokens)
            if burst.passes:
                fast_forwarded += burst.passes
                assert burst.end_ms <= t_fast + horizon
                assert all(len(toks) == burst.passes for toks in burst.tokens)
                for key, toks in zip(burst.keys, burst.tokens, strict=True):
                    fast_tokens.setdefault(key, []).extend(toks)
                assert abs(burst.simulated_ms - (burst.end_ms - t_fast)) < 1e-9
                t_fast = burst.end_ms
                for _ in range(burst.passes):
                    ref_step()
            else:
                res = fast.step(t_fast)
                for s in res.signals:
                    record(fast_tokens, s.key, s.token_id)
                t_fast += res.duration_ms
                ref_step()
        assert fast_tokens == ref_tokens
        assert t_fast == t_ref
        assert asdict(fast.metrics()) == asdict(ref.metrics())
        assert fast.next_ready_ms() == ref.next_ready_ms()
        fast._pool.check()


def test_fast_forward_runs_decode_passes_and_stops_where_step_must_take_over():
    args = EngineArgs.from_json({"block_size": 4, "speedup_ratio": 1.0})
    s = Scheduler(args)
    s.add(EngineRequest("a", [1, 2, 3], 10, token_deriver(42, "a")))
    assert s.fast_forward(0.0, 1e9, 100).passes == 0  # waiting: admission needs `step`
    first = s.step(0.0)
    assert [sig.position for sig in first.signals] == [0]
    t = first.duration_ms
    burst = s.fast_forward(t, 1e9, 100)
    # positions 1..8 are plain decode steps; position 9 finishes the request: `step` does it
    assert burst.passes == 8 and burst.keys == ["a"]
    assert burst.tokens == [[token_deriver(42, "a")(p) for p in range(1, 9)]]
    last = s.step(burst.end_ms)
    assert [(sig.position, sig.completed) for sig in last.signals] == [(9, True)]
    # a horizon shorter than one pass runs nothing
    s.add(EngineRequest("b", [1, 2, 3], 10, token_deriver(42, "b")))
    t2 = last.duration_ms + burst.end_ms
    t2 += s.step(t2).duration_ms
    assert s.fast_forward(t2, t2 + 0.001, 100).passes == 0
    assert s.fast_forward(t2, 1e9, 3).passes == 3  # max_tokens // running passes
