"""`Scheduler.fast_forward` is exactly a run of `step` calls, only cheaper.

Two schedulers get the same random workload; one only ever calls `step`, the other calls
`fast_forward` first and `step` when it ran nothing. After every operation their tokens,
metrics, KV pool and clocks must be identical.
"""

from __future__ import annotations

from dataclasses import asdict, replace

from hypothesis import given
from hypothesis import strategies as st

from mocker.engine import EngineArgs, EngineRequest, Scheduler
from mocker.engine.tokens import token_deriver
from tests.mocker.engine_strategies import CANCEL_OPS, PROPERTY, add_ops, small_engines

advance = st.tuples(
    st.just("advance"),
    st.integers(1, 80),  # max tokens of the fast-forward
    st.sampled_from([0.0, 0.5, 3.0, 40.0, float("inf")]),  # horizon past now (ms)
)
op = st.one_of(
    advance,
    advance,
    advance,
    add_ops(40, st.booleans()),  # the variant: a handoff (kv transferred, first position 1)
    CANCEL_OPS,
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


class Twins:
    """A `step`-only scheduler and a fast-forwarding one, driven in lockstep and compared."""

    def __init__(self, args: EngineArgs) -> None:
        self.ref, self.fast = Scheduler(args), Scheduler(args)
        self.ref_tokens: dict[str, list[int]] = {}
        self.fast_tokens: dict[str, list[int]] = {}
        self.t_ref = self.t_fast = 0.0
        self.fast_passes = 0

    def add(self, req: EngineRequest) -> None:
        self.ref.add(req)
        self.fast.add(replace(req))

    def cancel(self, key: str) -> None:
        assert self.ref.cancel(key) == self.fast.cancel(key)

    def _ref_step(self) -> None:
        res = self.ref.step(self.t_ref)
        for s in res.signals:
            if s.token_id is not None:
                self.ref_tokens.setdefault(s.key, []).append(s.token_id)
        self.t_ref += res.duration_ms

    def advance(self, max_tokens: int, horizon: float) -> None:
        fast = self.fast
        burst = fast.fast_forward(self.t_fast, self.t_fast + horizon, max_tokens)
        if burst.passes:
            self.fast_passes += burst.passes
            assert burst.end_ms <= self.t_fast + horizon
            assert all(len(toks) == burst.passes for toks in burst.tokens)
            for key, toks in zip(burst.keys, burst.tokens, strict=True):
                self.fast_tokens.setdefault(key, []).extend(toks)
            assert abs(burst.simulated_ms - (burst.end_ms - self.t_fast)) < 1e-9
            self.t_fast = burst.end_ms
            for _ in range(burst.passes):
                self._ref_step()
        else:
            res = fast.step(self.t_fast)
            for s in res.signals:
                if s.token_id is not None:
                    self.fast_tokens.setdefault(s.key, []).append(s.token_id)
            self.t_fast += res.duration_ms
            self._ref_step()

    def check(self) -> None:
        assert self.fast_tokens == self.ref_tokens
        assert self.t_fast == self.t_ref
        assert asdict(self.fast.metrics()) == asdict(self.ref.metrics())
        assert self.fast.next_ready_ms() == self.ref.next_ready_ms()
        self.fast._pool.check()


@PROPERTY
@given(args=small_engines(blocks=(6, 40), budget=(2, 64)),
       ops=st.lists(op, min_size=20, max_size=60))
def test_fast_forward_equals_repeated_steps(args: EngineArgs, ops: list[tuple]) -> None:
    twins = Twins(args)
    added = 0
    for o in ops:
        if o[0] == "add":
            twins.add(_request(added, *o[1:]))
            added += 1
        elif o[0] == "cancel":
            twins.cancel(f"r{o[1]}")
        else:
            twins.advance(o[1], o[2])
        twins.check()


def test_fast_forward_leaves_a_pass_whose_blocks_do_not_fit_to_step():
    """vllm, decode outgrowing the pool: the pass that cannot allocate (and preempts) is
    `step`'s, and nothing is allocated for it ahead of time."""
    twins = Twins(
        EngineArgs.from_json(
            {"engine_type": "vllm", "block_size": 4, "num_gpu_blocks": 8, "speedup_ratio": 1.0}
        )
    )
    twins.add(_request(0, 10, 40, 0, False))
    twins.add(_request(1, 10, 40, 1, False))
    for _ in range(60):
        twins.advance(64, float("inf"))
        twins.check()
    assert twins.fast_passes > 0
    assert twins.fast.metrics().preemptions > 0


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
