"""A profile's `request` latency (the `linear` model's request terms) over a real socket
(`mocker serve`, speedup 1): as a `delay`
the request waits before the engine takes it, and its tokens then come one per pass; as a
`floor` (docs/mocker.md "Timing") the engine runs it at once and holds its first token until
the latency has passed, so the tokens of the passes before it arrive together; as a `delay`
whose `request_after_share` is 1, the same, until the latency has passed since its first pass
ended."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.mocker.test_server_support import engine_process, request, tokens_of

REQUEST_MS = 300.0  # the latency: long against the machine's jitter
DECODE_MS = 2.0
TOKENS = 100  # 100 passes of 2 ms: the whole stream fits before the floor


def _timing(tmp_path: Path, kind: str, mode: str) -> dict:
    """The same path latency and pass times under the `profile` and the `linear` model."""
    if kind == "linear":  # a pass of DECODE_MS, the prefill pass as long
        return {"type": "linear", "pass_ms": DECODE_MS, "request_ms": REQUEST_MS,
                "request_mode": mode}
    csv = tmp_path / "profile.csv"
    csv.write_text(f"kind,tokens,ms\nprefill,1,1\ndecode,1,{DECODE_MS}\n"
                   f"request,1,{REQUEST_MS}\n")
    return {"type": "profile", "path": str(csv), "request_mode": mode}


@pytest.mark.parametrize("kind", ["profile", "linear"])
@pytest.mark.parametrize("mode", ["delay", "floor"])
def test_request_latency_delays_the_request_or_holds_its_first_token(tmp_path: Path,
                                                                     mode: str,
                                                                     kind: str) -> None:
    args = {"engine_type": "vllm", "timing": _timing(tmp_path, kind, mode)}
    with engine_process(tmp_path, f"engine-{mode}", "--speedup-ratio", "1",
                        "--engine-args", json.dumps(args)) as e:
        t0 = time.monotonic()
        stamps: list[float] = []
        out = []
        for msg in e.inference.Generate(request(f"r-{mode}", max_tokens=TOKENS), timeout=60):
            stamps.append(time.monotonic() - t0)
            out.append(msg)
    assert len(tokens_of(out)) == TOKENS
    ttft, spread = stamps[0], stamps[-2] - stamps[0]  # the last message is `finished`
    assert ttft >= REQUEST_MS / 1000
    if mode == "delay":  # one token per simulated 2 ms pass after the delay
        assert spread >= 0.9 * (TOKENS - 1) * DECODE_MS / 1000
    else:  # every pass ended before the floor: all of them come out at it, together
        assert spread < (TOKENS - 1) * DECODE_MS / 1000 / 2


def _message_stamps(tmp_path: Path, name: str, args: dict, max_tokens: int) -> list[float]:
    """Seconds from sending one request to each of its messages, on a `mocker serve` (speedup
    1) with engine args `args`."""
    with engine_process(tmp_path, name, "--speedup-ratio", "1",
                        "--engine-args", json.dumps(args)) as e:
        t0 = time.monotonic()
        return [time.monotonic() - t0
                for _msg in e.inference.Generate(request(f"r-{name}", max_tokens=max_tokens),
                                                 timeout=60)]


def test_a_held_first_token_comes_out_at_the_floor_inside_a_pass(tmp_path: Path) -> None:
    """Passes of 100 ms end at 1, 101, 201, 301 ms; the floor is 150 ms. The tokens of the
    first two passes come out at the floor (inside the pass ending at 201), not at 201: the
    engine loop wakes for the floor, as the delayed-ACK timer the floor models does."""
    floor_ms, step_ms = 150.0, 100.0
    csv = tmp_path / "profile.csv"
    csv.write_text(f"kind,tokens,ms\nprefill,1,1\ndecode,1,{step_ms}\nrequest,1,{floor_ms}\n")
    args = {"engine_type": "vllm",
            "timing": {"type": "profile", "path": str(csv), "request_mode": "floor"}}
    stamps = _message_stamps(tmp_path, "engine-mid-pass", args, max_tokens=4)
    ttft, third = stamps[0], stamps[2]
    assert floor_ms / 1000 <= ttft < (floor_ms + step_ms / 2) / 1000, stamps
    assert third - ttft > step_ms / 4 / 1000, stamps  # the third token is the 201 ms pass's


def _first_token_s(stream: Iterator[Any], t0: float, out: dict[str, float], name: str) -> None:
    for _msg in stream:
        out.setdefault(name, time.monotonic() - t0)


def test_a_delayed_request_starts_its_pass_when_it_becomes_ready(tmp_path: Path) -> None:
    """An idle engine, a per-request delay (`delay` mode), passes of 400 ms, two requests sent
    together: the one that arrives first runs in the pass that starts when it is ready, alone,
    though the other became ready moments later (before the loop's timer woke up for the
    first); the other takes the next pass. A pass that schedules nothing (the first still on
    its way) takes no time: charged the per-pass constant, it would hold the first back a
    whole 400 ms."""
    delay_ms, pass_ms = 100.0, 400.0
    args = {"engine_type": "vllm", "timing": {"type": "linear", "pass_ms": pass_ms,
                                              "request_ms": delay_ms}}
    with engine_process(tmp_path, "engine-ready", "--speedup-ratio", "1",
                        "--engine-args", json.dumps(args)) as e:
        firsts: dict[str, float] = {}
        t0 = time.monotonic()
        streams = {name: e.inference.Generate(request(f"r-{name}", max_tokens=2), timeout=60)
                   for name in ("a", "b")}
        threads = [threading.Thread(target=_first_token_s, args=(s, t0, firsts, n))
                   for n, s in streams.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    a, b = sorted(firsts.values())  # either may reach the engine first
    # the first: its delay, then one pass; the empty pass at its arrival would add one more
    assert (delay_ms + pass_ms) / 1000 <= a < (delay_ms + 1.5 * pass_ms) / 1000, firsts
    # the other: the pass after
    assert b - a > pass_ms / 2 / 1000, firsts


def test_a_latency_after_the_first_pass_runs_the_request_at_once_and_holds_its_first_token(
        tmp_path: Path) -> None:
    """Passes of 100 ms, a 250 ms latency all after the first pass (`request_after_share` 1):
    the engine runs the request at once (passes ending at 100, 200, 300 ms), and its first
    token comes out 250 ms after its pass, at 350 ms, with the two made meanwhile. All before
    the scheduler, the first token would come out at the same time, with the next ones a pass
    apart; as a `floor`, at 250 ms."""
    latency_ms, pass_ms = 250.0, 100.0
    args = {"engine_type": "vllm", "timing": {"type": "linear", "pass_ms": pass_ms,
                                              "request_ms": latency_ms,
                                              "request_after_share": 1.0}}
    stamps = _message_stamps(tmp_path, "engine-after", args, max_tokens=5)
    ttft, third, fourth = stamps[0], stamps[2], stamps[3]
    assert (latency_ms + pass_ms) / 1000 <= ttft < (latency_ms + 1.5 * pass_ms) / 1000, stamps
    assert third - ttft < pass_ms / 4 / 1000, stamps  # made before the release: out with it
    assert fourth - ttft > pass_ms / 4 / 1000, stamps  # the 400 ms pass's
