"""Scheduler behaviour on a simulated clock: admission, preemption, prefix hits, chunking."""

from __future__ import annotations

from collections import defaultdict

import pytest

from mocker.engine import (
    EngineArgs,
    EngineRequest,
    Scheduler,
    Signal,
    run_until_idle,
)
from mocker.engine.tokens import token_deriver


def req(key: str, prompt: list[int] | int, max_out: int, **kw: object) -> EngineRequest:
    if isinstance(prompt, int):
        prompt = [10_000 + hash(key) % 1000 + i for i in range(prompt)]
    return EngineRequest(key, prompt, max_out, token_deriver(42, key), **kw)  # type: ignore[arg-type]


def by_key(signals: list[tuple[float, Signal]]) -> dict[str, list[Signal]]:
    out: dict[str, list[Signal]] = defaultdict(list)
    for _, s in signals:
        out[s.key].append(s)
    return out


def assert_complete_stream(sigs: list[Signal], key: str, first: int, count: int) -> None:
    assert [s.position for s in sigs] == list(range(first, first + count))
    f = token_deriver(42, key)
    assert [s.token_id for s in sigs] == [f(p) for p in range(first, first + count)]
    assert [s.completed for s in sigs] == [False] * (count - 1) + [True]
    assert not any(s.rejected for s in sigs)
    assert sigs[0].cached_tokens is not None
    assert all(s.cached_tokens is None for s in sigs[1:])


def small(engine_type: str, **kw: object) -> EngineArgs:
    base: dict[str, object] = {
        "engine_type": engine_type,
        "block_size": 4,
        "num_gpu_blocks": 10,
        "speedup_ratio": 1.0,
    }
    base.update(kw)
    return EngineArgs.from_json(base)


def test_a_request_streams_every_position_once_then_completes() -> None:
    s = Scheduler(EngineArgs())
    s.add(req("a", 50, 5))
    end, sigs = run_until_idle(s)
    assert_complete_stream(by_key(sigs)["a"], "a", 0, 5)
    times = [t for t, _ in sigs]
    assert times == sorted(times) and len(set(times)) == 5  # one token per pass
    m = s.metrics()
    assert (m.running, m.waiting, m.used_blocks, m.completed, m.passes) == (0, 0, 0, 1, 5)
    assert m.busy_ms == pytest.approx(end)


def test_trtllm_reserves_to_completion_and_never_preempts() -> None:
    s = Scheduler(small("trtllm"))  # 10 blocks of 4 tokens
    s.add(req("a", 8, 12))  # reserves ceil(20/4) = 5 blocks
    s.add(req("b", 8, 12))  # 5 more: the pool is fully reserved
    s.add(req("c", 4, 4))
    s.step(0.0)
    m = s.metrics()
    # a and b hold 2 blocks each now; c would fit today but not to completion: it waits
    assert (m.running, m.waiting, m.used_blocks) == (2, 1, 4)
    _, sigs = run_until_idle(s, 100.0)
    got = by_key(sigs)
    for key, n in (("a", 12 - 1), ("b", 12 - 1), ("c", 4)):
        assert len(got[key]) == n
    t_first_c = min(t for t, sg in sigs if sg.key == "c")
    t_last_a = max(t for t, sg in sigs if sg.key == "a")
    assert t_first_c > t_last_a  # admitted only after a finished
    assert s.metrics().preemptions == 0
    assert s.metrics().used_blocks == 0


def test_vllm_admits_on_free_blocks_and_preempts_the_newest() -> None:
    s = Scheduler(small("vllm", num_gpu_blocks=6))  # 24 tokens
    s.add(req("a", 8, 8))
    s.add(req("b", 8, 8))
    seen: dict[str, list[Signal]] = defaultdict(list)
    for sg in s.step(0.0).signals:
        seen[sg.key].append(sg)
    assert s.metrics().running == 2  # admitted on current need (2+2 blocks <= 6)
    now = 1.0
    preempt_pass = None
    while s.has_work():
        before = s.metrics().preemptions
        res = s.step(now)
        now += res.duration_ms + 1
        for sg in res.signals:
            seen[sg.key].append(sg)
        if preempt_pass is None and s.metrics().preemptions > before:
            preempt_pass = res
            assert s.metrics().waiting == 1
            assert [sg.key for sg in res.signals] == ["a"]  # b (newest) was preempted
    assert preempt_pass is not None
    # b recomputes prompt + generated tokens and finishes its stream without gaps or repeats
    assert s.metrics().prefill_tokens > 16
    for key in ("a", "b"):
        sigs = seen[key]
        assert [x.position for x in sigs] == list(range(8))
        assert sigs[-1].completed
    assert s.metrics().used_blocks == 0


def test_vllm_head_of_line_waits_when_blocks_are_short() -> None:
    s = Scheduler(small("vllm", num_gpu_blocks=4))
    s.add(req("a", 12, 2))  # 3 blocks
    s.add(req("b", 8, 2))  # 2 blocks: does not fit next to a
    s.add(req("c", 2, 2))  # would fit, but FIFO: waits behind b
    s.step(0.0)
    assert (s.metrics().running, s.metrics().waiting) == (1, 2)


@pytest.mark.parametrize("engine_type", ["trtllm", "vllm"])
def test_never_fit_prompt_is_rejected_on_the_next_pass(engine_type: str) -> None:
    s = Scheduler(small(engine_type))  # 40 tokens
    s.add(req("big", 40, 1))
    assert s.metrics().waiting == 0
    assert not s.cancel("big")  # already finished (rejected)
    res = s.step(0.0)
    assert res.signals == [Signal("big", None, 0, completed=True, rejected=True)]
    assert res.duration_ms == 0.0
    assert not s.has_work()
    assert s.metrics().rejected == 1


def test_output_is_clamped_to_the_remaining_capacity() -> None:
    s = Scheduler(small("trtllm"))  # 40 tokens
    s.add(req("a", 30, 100))
    _, sigs = run_until_idle(s)
    assert_complete_stream(by_key(sigs)["a"], "a", 0, 10)


def test_prefix_hit_is_reported_once_and_capped_below_the_prompt() -> None:
    s = Scheduler(EngineArgs(speedup_ratio=0.0))  # block 32
    prompt = list(range(5000, 5096))  # 96 tokens = 3 full blocks
    s.add(req("a", prompt, 2))
    _, sigs = run_until_idle(s)
    assert by_key(sigs)["a"][0].cached_tokens == 0
    s.add(req("b", prompt, 2))
    res = s.step(0.0)
    assert res.signals[0].cached_tokens == 95  # 96 cached, the last token is recomputed
    assert res.prefill_tokens == 1
    run_until_idle(s)
    s.add(req("c", [*prompt, 1, 2, 3, 4], 2))
    assert s.step(0.0).signals[0].cached_tokens == 96
    run_until_idle(s)
    s.add(req("d", [7, *prompt[1:]], 2))  # chained hash: a different first block misses all
    assert s.step(0.0).signals[0].cached_tokens == 0


def test_prefix_caching_off_never_hits() -> None:
    s = Scheduler(EngineArgs(speedup_ratio=0.0, enable_prefix_caching=False))
    prompt = list(range(96))
    for key in ("a", "b"):
        s.add(req(key, prompt, 2))
        _, sigs = run_until_idle(s)
        assert by_key(sigs)[key][0].cached_tokens == 0
    assert s.metrics().inactive_blocks == 0


def test_concurrent_identical_prompts_share_active_blocks() -> None:
    s = Scheduler(EngineArgs(speedup_ratio=0.0))
    prompt = list(range(128))  # 4 full blocks
    s.add(req("a", prompt, 100))
    s.step(0.0)
    used_one = s.metrics().used_blocks
    s.add(req("b", prompt, 100))
    res = s.step(0.0)
    assert [x.cached_tokens for x in res.signals if x.key == "b"] == [127]
    assert s.metrics().used_blocks == used_one + 1  # b: only its private last/output block
    assert s.cancel("a") and s.cancel("b")
    m = s.metrics()
    assert m.used_blocks == 0 and m.inactive_blocks == 4


def test_inactive_blocks_are_evicted_when_capacity_is_needed() -> None:
    s = Scheduler(small("trtllm", num_gpu_blocks=6))
    s.add(req("a", list(range(100, 116)), 2))  # 4 full blocks, cached after
    run_until_idle(s)
    assert s.metrics().inactive_blocks == 4
    s.add(req("b", list(range(200, 216)), 2))  # needs 5 blocks: evicts a's blocks
    run_until_idle(s)
    assert s.metrics().evictions >= 3
    s.add(req("a2", list(range(100, 116)), 2))
    _, sigs = run_until_idle(s)
    assert sigs[0][1].cached_tokens < 12  # a's leaf blocks were evicted first


def test_chunked_prefill_shares_the_token_budget_with_decodes() -> None:
    s = Scheduler(EngineArgs(speedup_ratio=0.0, max_num_batched_tokens=100))
    s.add(req("a", 10, 50))
    s.step(0.0)  # a prefilled, decoding from now on
    s.add(req("b", 250, 3))
    chunks = []
    first_b = None
    for i in range(4):
        res = s.step(0.0)
        chunks.append(res.prefill_tokens)
        if first_b is None and any(x.key == "b" for x in res.signals):
            first_b = i
    assert chunks == [99, 99, 52, 0]  # a's decode takes 1 token of each pass
    assert first_b == 2  # the pass that finishes the prompt emits b's first token


def test_without_chunked_prefill_a_prompt_waits_for_a_pass_with_room() -> None:
    s = Scheduler(
        EngineArgs(speedup_ratio=0.0, max_num_batched_tokens=100, enable_chunked_prefill=False)
    )
    s.add(req("big", 101, 1))
    assert s.step(0.0).signals[0].rejected  # can never be scheduled in one pass
    s.add(req("a", 60, 2))
    s.add(req("b", 60, 2))
    res = s.step(0.0)
    assert res.prefill_tokens == 60 and s.metrics().waiting == 1
    res = s.step(0.0)
    assert res.prefill_tokens == 60


def test_max_num_seqs_bounds_the_running_set() -> None:
    s = Scheduler(EngineArgs(speedup_ratio=0.0, max_num_seqs=2))
    for k in "abc":
        s.add(req(k, 10, 5))
    s.step(0.0)
    assert (s.metrics().running, s.metrics().waiting) == (2, 1)


def test_cancel_releases_blocks_and_stops_the_stream() -> None:
    s = Scheduler(EngineArgs(speedup_ratio=0.0))
    s.add(req("a", 100, 1000))
    s.add(req("b", 100, 3))
    s.step(0.0)
    assert s.metrics().used_blocks > 0
    assert s.cancel("a")
    assert not s.cancel("a")
    assert not s.cancel("nope")
    _, sigs = run_until_idle(s)
    assert {sg.key for _, sg in sigs} == {"b"}
    m = s.metrics()
    assert (m.used_blocks, m.cancelled, m.running) == (0, 1, 0)
    s.add(req("w", 10, 3))
    assert s.cancel("w")  # cancelled while waiting
    assert not s.has_work()


def test_duplicate_keys_and_bad_requests_raise() -> None:
    s = Scheduler(EngineArgs())
    s.add(req("a", 10, 3))
    with pytest.raises(ValueError, match="already active"):
        s.add(req("a", 10, 3))
    with pytest.raises(ValueError, match="empty"):
        s.add(req("e", [], 3))
    with pytest.raises(ValueError, match="max_output_tokens"):
        s.add(req("z", 10, 0))


def test_handoff_decode_waits_for_the_transfer_then_decodes_without_prefill() -> None:
    s = Scheduler(EngineArgs(speedup_ratio=1.0))
    s.add(req("d", 1000, 4, first_position=1, kv_transferred=True, ready_at_ms=5.0))
    s.add(req("x", 10, 2))  # not held up by the transfer
    assert s.has_work(0.0)
    res = s.step(0.0)
    assert [x.key for x in res.signals] == ["x"]
    assert s.next_ready_ms(0.0) == 5.0
    run_until_idle(s, res.duration_ms)  # x finishes (t > 5)
    s2 = Scheduler(EngineArgs(speedup_ratio=1.0))
    s2.add(req("d", 1000, 4, first_position=1, kv_transferred=True, ready_at_ms=5.0))
    assert not s2.has_work(0.0) and s2.has_work()
    assert s2.next_ready_ms(0.0) == 5.0
    _, sigs = run_until_idle(s2)
    assert_complete_stream(by_key(sigs)["d"], "d", 1, 3)
    assert s2.metrics().prefill_tokens == 0
    assert sigs[0][0] > 5.0 and s2.metrics().used_blocks == 0


def test_nothing_left_to_generate_completes_without_a_token() -> None:
    s = Scheduler(EngineArgs())
    s.add(req("d", 10, 1, first_position=1, kv_transferred=True))
    assert s.step(0.0).signals == [Signal("d", None, 1, completed=True)]


def test_same_inputs_same_signals_and_times() -> None:
    def run() -> list[tuple[float, Signal]]:
        s = Scheduler(small("vllm", num_gpu_blocks=8, speedup_ratio=3.0))
        for i in range(6):
            s.add(req(f"r{i}", 6 + i, 5 + i))
        return run_until_idle(s)[1]

    assert run() == run()


@pytest.mark.parametrize(("engine_type", "first_token_decode", "ttft_ms"), [
    ("trtllm", None, 10.0), ("trtllm", True, 13.0), ("trtllm", False, 10.0),
    ("vllm", None, 10.0), ("vllm", False, 10.0), ("vllm", True, 13.0),
])
def test_first_token_decode_step_is_an_engine_arg(engine_type: str,
                                                  first_token_decode: bool | None,
                                                  ttft_ms: float) -> None:
    """The pass that finishes a prompt costs prefill alone, or prefill plus one decode step
    when `first_token_decode` is on (default off for both policies, as Dynamo 1.6.1's mocker
    and TensorRT-LLM: docs/fidelity.md)."""
    args: dict[str, object] = {"engine_type": engine_type,
                               "timing": {"type": "fixed", "prefill_ms": 10.0, "decode_ms": 3.0}}
    if first_token_decode is not None:
        args["first_token_decode"] = first_token_decode
    sched = Scheduler(EngineArgs.from_json(args))
    sched.add(req("a", 100, 3))
    _, out = run_until_idle(sched)
    times = [t for t, s in out if s.key == "a"]
    assert times == [ttft_ms, ttft_ms + 3.0, ttft_ms + 6.0]


def _profile_args(tmp_path: object, mode: str | None) -> EngineArgs:
    from pathlib import Path
    csv = Path(str(tmp_path)) / "profile.csv"
    csv.write_text("kind,tokens,ms\nprefill,1,10\ndecode,1,3\nrequest,1,41\n")
    timing: dict[str, object] = {"type": "profile", "path": str(csv)}
    if mode is not None:
        timing["request_mode"] = mode
    return EngineArgs.from_json({"engine_type": "vllm", "timing": timing})


@pytest.mark.parametrize(("mode", "times"), [
    # delay (the default): scheduled at 41, prefill 10, then one token per 3 ms decode
    (None, [51.0 + 3 * i for i in range(14)]),
    ("delay", [51.0 + 3 * i for i in range(14)]),
    # floor: scheduled at once; the tokens of the passes ending at 10, 13, .., 40 are held
    # and come out at the floor itself (41, inside the pass ending at 43), then one per pass
    ("floor", [41.0] * 11 + [43.0, 46.0, 49.0]),
])
def test_request_latency_as_a_delay_or_a_first_token_floor(tmp_path: object, mode: str | None,
                                                           times: list[float]) -> None:
    """A request with a 41 ms request latency (the server sets ready_at_ms = now + it):
    `delay` holds the request out of the engine, `floor` only holds its first token back,
    and a request without one (b) is not held either way."""
    sched = Scheduler(_profile_args(tmp_path, mode))
    sched.add(req("a", 4, 14, ready_at_ms=41.0))
    sched.add(req("b", 4, 2))
    _, out = run_until_idle(sched)
    a = [t for t, s in out if s.key == "a"]
    assert a == times
    assert [s.position for _, s in out if s.key == "a"] == list(range(14))
    assert next(t for t, s in out if s.key == "b") < 40.0


def test_first_token_floor_after_the_request_finished(tmp_path: object) -> None:
    """Tokens held past the request's last pass come out at the floor itself: an idle
    engine wakes for it (next_ready_ms), not a pass later."""
    sched = Scheduler(_profile_args(tmp_path, "floor"))
    sched.add(req("a", 4, 2, ready_at_ms=41.0))
    end, out = run_until_idle(sched)
    assert [(t, s.position, s.completed) for t, s in out] == [(41.0, 0, False), (41.0, 1, True)]
    assert end == 41.0


def test_vllm_prefix_hit_is_whole_blocks_below_the_prompt() -> None:
    """vLLM's hit is whole blocks within prompt - 1 (KVCacheManager.get_computed_blocks): a
    prompt cached to its last block recomputes that whole block; one token past a block
    boundary recomputes only the tokens past it."""
    s = Scheduler(EngineArgs(engine_type="vllm", speedup_ratio=0.0))  # block 64
    prompt = list(range(5000, 5128))  # 128 tokens = 2 full blocks
    s.add(req("a", prompt, 2))
    run_until_idle(s)
    s.add(req("b", prompt, 2))
    res = s.step(0.0)
    assert res.signals[0].cached_tokens == 64  # not 127: the last block is recomputed
    assert res.prefill_tokens == 64
    run_until_idle(s)
    s.add(req("c", [*prompt, 1, 2], 2))  # 130 tokens: both cached blocks are below 129
    res = s.step(0.0)
    assert res.signals[0].cached_tokens == 128 and res.prefill_tokens == 2
