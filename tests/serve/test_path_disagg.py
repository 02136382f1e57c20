"""End to end, disaggregated: openai client -> `lab frontend` -> prefill sidecar + mocker, then
decode sidecar + mocker with the JSON handoff. Also the handoff itself over the request plane:
a faithful one passes the decode engine's strict validation, a mangled one fails cleanly."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from lab.serve.frontend.protocol import GenRequest
from lab.serve.request_plane import FrameType, RequestPlaneClient
from lab.wire import constants as wc
from tests.procs import Proc, frontend_argv, mocker_argv, sidecar_argv
from tests.serve.test_path_aggregated import (
    MODEL,
    assert_concurrent_counts,
    stream_completion,
    unary_completion,
    wait_healthy,
)


def start_disagg(
    spawn: Callable[..., Proc], tmp_path: Path, frontends: bool = True
) -> dict[str, Proc]:
    disc = str(tmp_path / "disc")
    procs: dict[str, Proc] = {}
    for role in ("prefill", "decode"):
        procs[f"engine-{role}"] = spawn(
            f"engine-{role}-0",
            mocker_argv(role=role, instance_id=f"engine-{role}-0-0001", speedup=1000.0),
            ready=False,
        )
    for role in ("prefill", "decode"):
        engine = procs[f"engine-{role}"]
        engine.wait_ready(30)
        procs[f"sidecar-{role}"] = spawn(
            f"sidecar-{role}-0",
            sidecar_argv(engine.address, disc, f"sidecar-{role}-0"),
            ready=False,
        )
    if frontends:
        expect = ("--expect", "prefill=1", "--expect", "decode=1")
        procs["frontend"] = spawn("frontend", frontend_argv(disc, *expect), ready=False)
        procs["strict"] = spawn(
            "frontend-strict", frontend_argv(disc, *expect, "--enforce-disagg"), ready=False
        )
        procs["frontend"].wait_ready(30)
        procs["strict"].wait_ready(30)
    for role in ("prefill", "decode"):
        procs[f"sidecar-{role}"].wait_ready(30)
    return procs


def client(proc: Proc) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"http://{proc.address}/v1", api_key="unused", max_retries=0, timeout=30
    )


async def test_disaggregated_path_distinct_workers_exact_counts(
    spawn: Callable[..., Proc], tmp_path: Path
) -> None:
    procs = start_disagg(spawn, tmp_path)
    url = f"http://{procs['frontend'].address}"
    await wait_healthy(url)
    await wait_healthy(f"http://{procs['strict'].address}")
    oa = client(procs["frontend"])

    text, usage, nvext, _ = await stream_completion(oa, 30)
    assert len(text.split()) == 30
    assert usage.completion_tokens == 30 and usage.prompt_tokens == 20
    assert nvext["worker_id"] == {
        "prefill_worker_id": "sidecar-prefill-0",
        "decode_worker_id": "sidecar-decode-0",
    }
    timing = nvext["timing"]
    assert timing["prefill_time_ms"] is not None and timing["prefill_time_ms"] >= 0
    assert timing["ttft_ms"] >= timing["prefill_wait_time_ms"]

    # a shared prefix is cached by the prefill engine, and the decode leg reports it
    prompt = list(range(1000, 1100))
    await stream_completion(oa, 2, prompt=prompt)
    _, usage, _, _ = await stream_completion(oa, 2, prompt=prompt)
    assert usage.prompt_tokens_details.cached_tokens > 0

    await assert_concurrent_counts(oa, 5, 12)

    out = await unary_completion(
        oa, "some words for the prompt", 11, nvext={"extra_fields": ["worker_id"]}
    )
    assert out.usage.completion_tokens == 11
    assert "handoff" not in out.model_dump_json()
    ids = out.model_extra["nvext"]["worker_id"]
    assert ids["prefill_worker_id"] != ids["decode_worker_id"]
    procs["frontend"].wait_log("prefill_worker=sidecar-prefill-0 decode_worker=sidecar-decode-0")

    # the prefill worker leaves: the strict frontend refuses, the other serves aggregated
    procs["sidecar-prefill"].signal(signal.SIGTERM)
    procs["frontend"].wait_log("worker left: sidecar-prefill-0", timeout=15)
    procs["strict"].wait_log("worker left: sidecar-prefill-0", timeout=15)
    strict = client(procs["strict"])
    with pytest.raises(openai.APIStatusError) as info:
        await strict.completions.create(model=MODEL, prompt=[1, 2], max_tokens=3)
    assert info.value.status_code == 503
    assert "enforce-disagg" in str(info.value)
    text, _, nvext, _ = await stream_completion(oa, 4)
    assert len(text.split()) == 4
    assert nvext["worker_id"] == {"prefill_worker_id": None, "decode_worker_id": "sidecar-decode-0"}
    async with aiohttp.ClientSession() as session, session.get(url + "/health") as resp:
        # --expect prefill=1 no longer holds, but the decode worker serves whole requests
        assert (resp.status, (await resp.json())["status"]) == (200, "degraded")
    await oa.close()
    await strict.close()


async def _run(client_: RequestPlaneClient, payload: dict[str, Any]) -> tuple[list[int], dict]:
    tokens: list[int] = []
    end: dict = {}
    stream = await client_.open_stream(payload)
    async for ftype, p in stream:
        if ftype == FrameType.CHUNK:
            tokens.extend(p["t"])
        else:
            end = p
    return tokens, end


async def test_handoff_json_round_trip_and_mangled_handoffs(
    spawn: Callable[..., Proc], tmp_path: Path
) -> None:
    procs = start_disagg(spawn, tmp_path, frontends=False)
    prefill = RequestPlaneClient(procs["sidecar-prefill"].address)
    decode = RequestPlaneClient(procs["sidecar-decode"].address)

    def request(rid: str) -> dict[str, Any]:
        req = GenRequest(
            endpoint="completions",
            model=MODEL,
            token_ids=list(range(1, 40)),
            max_tokens=8,
            min_tokens=8,
            ignore_eos=True,
        )
        return req.plane_payload(rid)

    async def handoff(rid: str) -> dict[str, Any]:
        _, end = await asyncio.wait_for(_run(prefill, request(rid)), 10)
        assert end["error"] is None and end["handoff"], end
        return end

    try:
        # faithful: the decode engine accepts it and produces the whole answer
        end = await handoff("good")
        payload = request("good")
        payload["handoff"] = end["handoff"]
        payload["prefill_cached_tokens"] = end["usage"]["cached_tokens"]
        tokens, dend = await asyncio.wait_for(_run(decode, payload), 10)
        assert dend["error"] is None and len(tokens) == 8 and dend["finish"] == "length"

        # mangled: a missing key, a wrong session, garbage: each a clear error, nothing hangs
        def attrs(h: dict, **changes: Any) -> dict:
            return {**h, "attributes": {**h["attributes"], **changes}}

        manglers = {
            "missing session_id": lambda h: {k: v for k, v in h.items() if k != "session_id"},
            "foreign session": lambda h: {**h, "session_id": "12345"},
            "rounded ttft": lambda h: attrs(
                h, **{wc.ATTR_TTFT_MS: round(h["attributes"][wc.ATTR_TTFT_MS])}
            ),
            "flattened list": lambda h: attrs(
                h, **{wc.ATTR_FIRST_GEN_TOKENS: h["attributes"][wc.ATTR_FIRST_GEN_TOKENS][0]}
            ),
            "not an object": lambda h: "garbage",
        }
        for i, (what, mangle) in enumerate(manglers.items()):
            end = await handoff(f"bad{i}")
            payload = request(f"bad{i}")
            payload["handoff"] = mangle(end["handoff"])
            tokens, dend = await asyncio.wait_for(_run(decode, payload), 10)
            error = dend.get("error")
            assert error, f"{what}: accepted"
            assert 400 <= error["status"] <= 599, (what, error)
            if what == "missing session_id":
                assert "session_id" in error["message"]
    finally:
        await prefill.close()
        await decode.close()
