"""End to end, aggregated: openai client -> `lab frontend` -> `lab sidecar` -> `mocker serve`,
every part a real process on a real socket."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from tests.procs import Proc, engine_load, frontend_argv, mocker_argv, sidecar_argv

MODEL = "mocker-model"


@dataclass
class Stack:
    url: str
    frontend: Proc
    engines: list[Proc]
    sidecars: list[Proc]

    def client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=30
        )


def start_stack(
    spawn: Callable[..., Proc],
    tmp_path: Path,
    workers: int = 1,
    speedup: float = 1000.0,
    frontend_extra: tuple[str, ...] = (),
) -> Stack:
    disc = str(tmp_path / "disc")
    engines = [
        spawn(
            f"engine-{i}",
            mocker_argv(role="aggregated", instance_id=f"engine-{i}-0001", speedup=speedup),
            ready=False,
        )
        for i in range(workers)
    ]
    for engine in engines:
        engine.wait_ready(30)
    sidecars = [
        spawn(f"sidecar-{i}", sidecar_argv(engine.address, disc, f"sidecar-{i}"), ready=False)
        for i, engine in enumerate(engines)
    ]
    fe = spawn(
        "frontend", frontend_argv(disc, "--expect", f"aggregated={workers}", *frontend_extra)
    )
    for sidecar in sidecars:
        sidecar.wait_ready(30)
    return Stack(f"http://{fe.address}", fe, engines, sidecars)


async def wait_healthy(url: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while True:
            async with session.get(url + "/health") as resp:
                if resp.status == 200 and (await resp.json())["status"] == "healthy":
                    return
            if time.monotonic() > deadline:
                raise TimeoutError("frontend never became healthy")
            await asyncio.sleep(0.05)


async def stream_completion(
    oa: openai.AsyncOpenAI, n: int, prompt: Any = None, **extra: Any
) -> tuple[str, Any, dict, int]:
    """Stream one completion of exactly n tokens; returns (text, usage, nvext, events)."""
    stream = await oa.completions.create(
        model=MODEL,
        prompt=prompt if prompt is not None else list(range(1, 21)),
        max_tokens=n,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={
            "min_tokens": n,
            "ignore_eos": True,
            "nvext": {"extra_fields": ["worker_id", "timing"]},
            **extra,
        },
    )
    text, usage, nvext, events = "", None, {}, 0
    async for chunk in stream:
        events += 1
        if chunk.choices:
            text += chunk.choices[0].text
            nvext = (chunk.model_extra or {}).get("nvext") or nvext
        if chunk.usage:
            usage = chunk.usage
    return text, usage, nvext, events


async def assert_concurrent_counts(oa: openai.AsyncOpenAI, first: int, n: int) -> None:
    """n streams at once, of first, first + 1, ... tokens: each gets exactly its count."""
    results = await asyncio.gather(*(stream_completion(oa, first + i) for i in range(n)))
    assert [len(r[0].split()) for r in results] == [first + i for i in range(n)]


async def unary_completion(
    oa: openai.AsyncOpenAI, prompt: str, n: int, **extra: Any
) -> openai.types.Completion:
    """One non-streaming completion that must have exactly n tokens."""
    out = await oa.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=n,
        extra_body={"min_tokens": n, "ignore_eos": True, **extra},
    )
    assert len(out.choices[0].text.split()) == n
    return out


async def test_aggregated_stream_and_unary_exact_token_counts(
    spawn: Callable[..., Proc], tmp_path: Path
) -> None:
    stack = start_stack(spawn, tmp_path)
    await wait_healthy(stack.url)
    oa = stack.client()

    text, usage, nvext, events = await stream_completion(oa, 40)
    assert len(text.split()) == 40
    assert usage.completion_tokens == 40 and usage.prompt_tokens == 20
    assert nvext["worker_id"] == {"prefill_worker_id": None, "decode_worker_id": "sidecar-0"}
    assert 0 < nvext["timing"]["ttft_ms"] <= nvext["timing"]["total_time_ms"]
    assert events <= 40 + 2  # at most one event per token, plus finish and usage

    await assert_concurrent_counts(oa, 10, 16)

    out = await unary_completion(oa, "a text prompt of seven words here", 9)
    assert out.usage.prompt_tokens == 7 and out.usage.completion_tokens == 9
    assert out.choices[0].finish_reason == "length"

    chat = await oa.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hello there"}],
        max_tokens=6,
        extra_body={"min_tokens": 6, "ignore_eos": True},
    )
    assert len(chat.choices[0].message.content.split()) == 6
    assert chat.usage.completion_tokens == 6

    chat_stream = await oa.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hello there"}],
        max_tokens=5,
        stream=True,
        extra_body={"min_tokens": 5, "ignore_eos": True},
    )
    content = ""
    async for chunk in chat_stream:
        if chunk.choices and chunk.choices[0].delta.content:
            content += chunk.choices[0].delta.content
    assert len(content.split()) == 5
    await oa.close()
    log = stack.frontend.log()
    assert log.count("request id=") >= 20
    assert "prefill_worker=- decode_worker=sidecar-0" in log


async def test_client_disconnect_mid_stream_aborts_the_engine_request(
    spawn: Callable[..., Proc], tmp_path: Path
) -> None:
    stack = start_stack(spawn, tmp_path, speedup=1.0)  # real-time engine: a long request
    await wait_healthy(stack.url)
    engine = stack.engines[0].address
    oa = stack.client()
    stream = await oa.completions.create(
        model=MODEL,
        prompt=list(range(1, 11)),
        max_tokens=5000,
        stream=True,
        extra_body={"ignore_eos": True, "min_tokens": 5000},
    )
    seen = 0
    async for _chunk in stream:
        seen += 1
        if seen == 2:
            break
    assert (await asyncio.to_thread(engine_load, engine))["running"] == 1
    await stream.close()  # the client goes away mid-stream
    deadline = time.monotonic() + 10
    while (await asyncio.to_thread(engine_load, engine))["running"] != 0:
        assert time.monotonic() < deadline, "the engine still runs the abandoned request"
        await asyncio.sleep(0.1)
    await oa.close()
    stack.frontend.wait_log("outcome=cancelled")


async def test_worker_that_expires_from_discovery(
    spawn: Callable[..., Proc], tmp_path: Path
) -> None:
    stack = start_stack(spawn, tmp_path, workers=2, frontend_extra=("--discovery-ttl", "3"))
    await wait_healthy(stack.url)
    oa = stack.client()
    seen = set()
    for _ in range(4):
        _, _, nvext, _ = await stream_completion(oa, 3)
        seen.add(nvext["worker_id"]["decode_worker_id"])
    assert seen == {"sidecar-0", "sidecar-1"}

    # sidecar-1 dies without withdrawing: its record stays until it expires; meanwhile the
    # frontend cannot connect to it and uses sidecar-0
    stack.sidecars[1].signal(signal.SIGKILL)
    stack.sidecars[1].popen.wait(5)
    for _ in range(4):
        text, _, nvext, _ = await stream_completion(oa, 3)
        assert len(text.split()) == 3
        assert nvext["worker_id"]["decode_worker_id"] == "sidecar-0"
    stack.frontend.wait_log("worker left: sidecar-1", timeout=15)
    async with aiohttp.ClientSession() as session, session.get(stack.url + "/health") as resp:
        # --expect aggregated=2 no longer holds, but sidecar-0 serves
        assert (resp.status, (await resp.json())["status"]) == (200, "degraded")
    _, _, nvext, _ = await stream_completion(oa, 3)
    assert nvext["worker_id"]["decode_worker_id"] == "sidecar-0"

    # the last worker dies too: once it expired, requests get 503
    stack.sidecars[0].signal(signal.SIGKILL)
    stack.sidecars[0].popen.wait(5)
    stack.frontend.wait_log("worker left: sidecar-0", timeout=15)
    with pytest.raises(openai.APIStatusError) as info:
        await oa.completions.create(model=MODEL, prompt=[1], max_tokens=2)
    assert info.value.status_code == 503
    await oa.close()
