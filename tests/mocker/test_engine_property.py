"""Property test: random workloads keep the pool consistent and end every request once."""

from __future__ import annotations

from collections import Counter, defaultdict

from hypothesis import given
from hypothesis import strategies as st

from mocker.engine import EngineArgs, EngineRequest, Scheduler, Signal
from mocker.engine.tokens import token_deriver
from tests.mocker.engine_strategies import CANCEL_OPS, PROPERTY, add_ops, small_engines

op = st.one_of(
    add_ops(12, st.integers(0, 3)),  # the variant: 1 a handoff, 2-3 a ready delay
    CANCEL_OPS,
    st.tuples(st.just("step"), st.integers(1, 4)),
)


@PROPERTY
@given(args=small_engines(blocks=(4, 24), budget=(4, 64), vary_chunked=True),
       ops=st.lists(op, max_size=40))
def test_random_workloads(args: EngineArgs, ops: list[tuple]) -> None:
    s = Scheduler(args)
    added: list[str] = []
    first_pos: dict[str, int] = {}
    cancelled: set[str] = set()
    sigs: dict[str, list[Signal]] = defaultdict(list)
    now = 0.0

    def check() -> None:
        m = s.metrics()
        s._pool.check()
        assert 0 <= m.used_blocks <= m.total_blocks
        assert m.used_blocks + m.inactive_blocks <= m.total_blocks
        assert m.free_blocks >= 0
        assert m.running <= args.max_num_seqs
        if args.engine_type == "trtllm":
            assert m.preemptions == 0 and m.alloc_stalls == 0
            missing = [r.reserve - r.n_shared - r.private for r in s._running]
            assert min(missing, default=0) >= 0
            assert s._outstanding == sum(missing)
            assert s._outstanding <= m.free_blocks  # the guarantee of guaranteed_no_evict

    def step() -> None:
        nonlocal now
        res = s.step(now)
        now += res.duration_ms
        if not res.signals and res.batch_size == 0:
            nxt = s.next_ready_ms(now)
            now = max(now, nxt or now) + 0.5
        for sg in res.signals:
            assert sg.key not in cancelled
            sigs[sg.key].append(sg)
        check()

    for o in ops:
        if o[0] == "add":
            _, plen, max_out, fam, variant = o
            key = f"r{len(added)}"
            prompt = [fam * 1000 + i for i in range(plen)]
            first = 1 if variant == 1 else 0
            s.add(
                EngineRequest(
                    key,
                    prompt,
                    max_out,
                    token_deriver(7, key),
                    first_position=first,
                    kv_transferred=variant == 1,
                    ready_at_ms=now + 3.0 if variant >= 2 else 0.0,
                )
            )
            added.append(key)
            first_pos[key] = first
        elif o[0] == "cancel":
            if added:
                key = added[o[1] % len(added)]
                if s.cancel(key):
                    cancelled.add(key)
        else:
            for _ in range(o[1]):
                step()
    for _ in range(10_000):
        if not s.has_work():
            break
        step()
    assert not s.has_work()

    m = s.metrics()
    assert (m.running, m.waiting, m.used_blocks) == (0, 0, 0)
    ends = Counter()
    for key in added:
        got = sigs.get(key, [])
        ends[key] = sum(1 for x in got if x.completed) + (key in cancelled)
        assert ends[key] == 1, (key, got)
        if key in cancelled or got[-1].rejected or got[-1].token_id is None:
            continue
        f = token_deriver(7, key)
        start = first_pos[key]
        assert [x.position for x in got] == list(range(start, start + len(got)))
        assert [x.token_id for x in got] == [f(x.position) for x in got]
        assert got[-1].completed and got[0].cached_tokens is not None
