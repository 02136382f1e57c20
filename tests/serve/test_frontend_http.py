"""The frontend's HTTP layer against in-process fake workers (real HTTP sockets, fake fleet)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from lab.serve.frontend.server import FrontendServer, running
from lab.serve.tokenizer import word_token_id
from tests.serve.fakes import (
    FakeFleet,
    FakeWorker,
    error_behavior,
    fleet_settings,
    stall_behavior,
)
from tests.waiting import wait_for

MODEL = "mocker-model"


@contextlib.asynccontextmanager
async def frontend(fleet: FakeFleet, **options: Any) -> AsyncIterator[str]:
    config = fleet_settings(**options)
    server = FrontendServer(config, registry=fleet, client_factory=fleet.client_factory)
    async with running(server) as url:
        await server.workers.synced.wait()
        yield url


def sse_events(raw: bytes) -> list[Any]:
    """Parse an SSE body into JSON objects (and the string "[DONE]")."""
    events: list[Any] = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        events.append(data if data == "[DONE]" else orjson.loads(data))
    return events


async def post(url: str, path: str, body: Any, raw: bytes | None = None) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session:
        data = raw if raw is not None else orjson.dumps(body)
        async with session.post(
            url + path, data=data, headers={"Content-Type": "application/json"}
        ) as resp:
            return resp.status, await resp.read()


def completion(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 10, **extra}


# --- happy paths -------------------------------------------------------------------------------


async def test_completion_stream_one_event_per_chunk_with_usage() -> None:
    fleet = FakeFleet(FakeWorker("w0", per_chunk=3))
    async with frontend(fleet) as url:
        status, body = await post(
            url,
            "/v1/completions",
            completion(stream=True, stream_options={"include_usage": True}),
        )
    assert status == 200
    events = sse_events(body)
    assert events[-1] == "[DONE]"
    token_events = [e for e in events[:-1] if e["choices"] and e["choices"][0]["text"]]
    assert len(token_events) == 4  # chunks of 3, 3, 3, 1 tokens
    text = "".join(e["choices"][0]["text"] for e in token_events)
    assert len(text.split()) == 10
    assert text.split()[0] == "<token:100>"
    finish = events[-3]
    assert finish["choices"][0]["finish_reason"] == "length"
    usage = events[-2]
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 10
    assert usage["usage"]["prompt_tokens"] == 3
    assert usage["usage"]["total_tokens"] == 13
    assert usage["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    sent = fleet.workers["w0"].requests[0]
    assert sent["token_ids"] == [1, 2, 3] and sent["max_tokens"] == 10


async def test_completion_non_stream_text_prompt_and_params() -> None:
    fleet = FakeFleet(FakeWorker("w0"))
    async with frontend(fleet) as url:
        status, body = await post(
            url,
            "/v1/completions",
            {
                "model": MODEL,
                "prompt": "hello big <token:42> world",
                "max_completion_tokens": 5,
                "min_tokens": 5,
                "ignore_eos": True,
                "temperature": 0.5,
                "top_p": 0.9,
                "seed": 7,
                "stop": ["halt"],
            },
        )
    assert status == 200, body
    out = orjson.loads(body)
    assert out["object"] == "text_completion"
    assert len(out["choices"][0]["text"].split()) == 5
    assert out["usage"]["completion_tokens"] == 5
    assert out["usage"]["prompt_tokens"] == 4
    sent = fleet.workers["w0"].requests[0]
    assert sent["token_ids"] == [
        word_token_id("hello"),
        word_token_id("big"),
        42,
        word_token_id("world"),
    ]
    assert sent["max_tokens"] == 5 and sent["min_tokens"] == 5 and sent["ignore_eos"] is True
    assert sent["temperature"] == 0.5 and sent["top_p"] == 0.9 and sent["seed"] == 7
    assert sent["stop_token_ids"] == [word_token_id("halt")]


async def test_chat_stream_and_non_stream() -> None:
    fleet = FakeFleet(FakeWorker("w0", per_chunk=2))
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "max_tokens": 4,
    }
    async with frontend(fleet) as url:
        status, raw = await post(url, "/v1/chat/completions", {**body, "stream": True})
        assert status == 200
        events = sse_events(raw)
        assert events[0]["object"] == "chat.completion.chunk"
        assert events[0]["choices"][0]["delta"]["role"] == "assistant"
        content = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1])
        assert len(content.split()) == 4
        assert events[-2]["choices"][0]["finish_reason"] == "length"

        status, raw = await post(url, "/v1/chat/completions", body)
        assert status == 200
        out = orjson.loads(raw)
        assert out["object"] == "chat.completion"
        assert out["choices"][0]["message"]["role"] == "assistant"
        assert len(out["choices"][0]["message"]["content"].split()) == 4
    # template: "system: be brief\nuser: hi\nassistant:" -> 6 words
    assert len(fleet.workers["w0"].requests[0]["token_ids"]) == 6


async def test_nvext_worker_id_and_timing_stream_and_unary() -> None:
    fleet = FakeFleet(FakeWorker("w0"))
    nv = {"extra_fields": ["worker_id", "timing"]}
    async with frontend(fleet) as url:
        _, raw = await post(url, "/v1/completions", completion(stream=True, nvext=nv))
        events = sse_events(raw)
        with_finish = [e for e in events[:-1] if e["choices"][0]["finish_reason"]]
        assert len(with_finish) == 1 and "nvext" in with_finish[0]
        assert all("nvext" not in e for e in events[:-1] if e is not with_finish[0])
        nvext = with_finish[0]["nvext"]
        assert nvext["worker_id"] == {"prefill_worker_id": None, "decode_worker_id": "w0"}
        timing = nvext["timing"]
        assert set(timing) == {
            "request_received_ms",
            "prefill_wait_time_ms",
            "prefill_time_ms",
            "ttft_ms",
            "total_time_ms",
        }
        assert 0 <= timing["ttft_ms"] <= timing["total_time_ms"]

        _, raw = await post(url, "/v1/completions", completion(nvext=nv))
        assert orjson.loads(raw)["nvext"]["worker_id"]["decode_worker_id"] == "w0"
        _, raw = await post(url, "/v1/completions", completion())
        assert "nvext" not in orjson.loads(raw)


async def test_logprobs_completions_and_chat() -> None:
    fleet = FakeFleet(FakeWorker("w0", per_chunk=2))
    async with frontend(fleet) as url:
        _, raw = await post(url, "/v1/completions", completion(max_tokens=3, logprobs=2))
        lp = orjson.loads(raw)["choices"][0]["logprobs"]
        assert lp["token_logprobs"] == [-0.5, -0.5, -0.5]
        assert lp["tokens"] == ["<token:100> ", "<token:101> ", "<token:102> "]
        assert lp["top_logprobs"][0] == {"<token:100> ": -0.5, "<token:5> ": -1.5}
        assert fleet.workers["w0"].requests[-1]["top_logprobs"] == 2

        chat = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 2,
            "logprobs": True,
            "top_logprobs": 1,
            "stream": True,
        }
        _, raw = await post(url, "/v1/chat/completions", chat)
        events = sse_events(raw)
        content = events[0]["choices"][0]["logprobs"]["content"]
        assert content[0]["token"] == "<token:100> " and content[0]["logprob"] == -0.5
        assert content[0]["top_logprobs"][1]["token"] == "<token:5> "


# --- disaggregation ----------------------------------------------------------------------------


async def test_disaggregated_prefill_then_decode_with_handoff() -> None:
    fleet = FakeFleet(
        FakeWorker("p0", role="prefill", cached_tokens=2),
        FakeWorker("d0", role="decode", per_chunk=4),
    )
    nv = {"extra_fields": ["worker_id", "timing"]}
    async with frontend(fleet) as url:
        status, raw = await post(
            url,
            "/v1/completions",
            completion(stream=True, nvext=nv, stream_options={"include_usage": True}),
        )
    assert status == 200
    assert b"sess-" not in raw and b"handoff" not in raw  # the client never sees the handoff
    events = sse_events(raw)
    finish = next(e for e in events[:-1] if e["choices"] and e["choices"][0]["finish_reason"])
    assert finish["nvext"]["worker_id"] == {"prefill_worker_id": "p0", "decode_worker_id": "d0"}
    assert finish["nvext"]["timing"]["prefill_time_ms"] is not None
    assert events[-2]["usage"]["completion_tokens"] == 10
    assert events[-2]["usage"]["prompt_tokens_details"]["cached_tokens"] == 2
    prefill_req = fleet.workers["p0"].requests[0]
    decode_req = fleet.workers["d0"].requests[0]
    assert prefill_req["handoff"] is None
    assert decode_req["handoff"]["session_id"] == f"sess-{prefill_req['request_id']}"
    assert decode_req["max_tokens"] == 10
    assert decode_req["prefill_cached_tokens"] == 2
    assert decode_req["token_ids"] == [1, 2, 3]


async def test_no_prefill_workers_aggregated_unless_enforced() -> None:
    fleet = FakeFleet(FakeWorker("d0", role="decode"))
    async with frontend(fleet) as url:
        status, raw = await post(
            url, "/v1/completions", completion(nvext={"extra_fields": ["worker_id"]})
        )
        assert status == 200
        assert orjson.loads(raw)["nvext"]["worker_id"]["prefill_worker_id"] is None
        assert fleet.workers["d0"].requests[0]["handoff"] is None
    async with frontend(fleet, enforce_disagg=True) as url:
        status, raw = await post(url, "/v1/completions", completion())
        assert status == 503
        assert "enforce-disagg" in orjson.loads(raw)["error"]["message"]


# --- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": [1]}, "model"),
        (completion(max_tokens="ten"), "max_tokens"),
        (completion(max_tokens=0), "max_tokens"),
        (completion(min_tokens=11), "min_tokens"),
        (completion(temperature=9), "temperature"),
        (completion(top_p=0), "top_p"),
        (completion(stream="yes"), "stream"),
        (completion(prompt=None), "prompt"),
        (completion(prompt=[]), "prompt"),
        (completion(prompt=[1, "a"]), "prompt"),
        (completion(prompt=[-1]), "prompt"),
        (completion(stop="two words"), "stop"),
        (completion(n=2), "n"),
        (completion(seed=-1), "seed"),
        (completion(logprobs=99), "logprobs"),
        (completion(nvext={"extra_fields": "timing"}), "nvext.extra_fields"),
        (completion(stream_options=[1]), "stream_options"),
    ],
)
async def test_invalid_fields_are_400_naming_the_field(body: dict, param: str) -> None:
    fleet = FakeFleet(FakeWorker("w0"))
    async with frontend(fleet) as url:
        status, raw = await post(url, "/v1/completions", body)
    assert status == 400, raw
    err = orjson.loads(raw)["error"]
    assert err["param"] == param
    assert err["message"].startswith(param)
    assert err["type"] == "invalid_request_error"
    assert fleet.workers["w0"].requests == []


async def test_chat_invalid_fields() -> None:
    fleet = FakeFleet(FakeWorker("w0"))
    async with frontend(fleet) as url:
        for body, param in [
            ({"model": MODEL, "messages": []}, "messages"),
            ({"model": MODEL, "messages": [{"content": "x"}]}, "messages[0].role"),
            ({"model": MODEL, "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
            (
                {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
                "top_logprobs",
            ),
        ]:
            status, raw = await post(url, "/v1/chat/completions", body)
            assert status == 400
            assert orjson.loads(raw)["error"]["param"] == param


async def test_malformed_json_unknown_model_and_too_large_body() -> None:
    fleet = FakeFleet(FakeWorker("w0"))
    async with frontend(fleet, max_body_bytes=2000) as url:
        status, raw = await post(url, "/v1/completions", None, raw=b'{"model": "x",')
        assert status == 400
        assert "malformed JSON" in orjson.loads(raw)["error"]["message"]
        status, raw = await post(url, "/v1/completions", None, raw=b"[1, 2]")
        assert status == 400

        status, raw = await post(url, "/v1/completions", completion(model="gpt-9"))
        assert status == 404
        err = orjson.loads(raw)["error"]
        assert err["param"] == "model" and "gpt-9" in err["message"]

        big = completion(prompt=list(range(1000)))
        status, raw = await post(url, "/v1/completions", big)
        assert status == 413
        assert "limit of 2000 bytes" in orjson.loads(raw)["error"]["message"]
        # the limit holds for chunked bodies (no Content-Length) too
        async with aiohttp.ClientSession() as session:

            async def gen() -> AsyncIterator[bytes]:
                yield orjson.dumps(big)

            async with session.post(url + "/v1/completions", data=gen(),
                                    headers={"Content-Type": "application/json"}) as resp:
                assert resp.status == 413
                assert (await resp.json())["error"]["code"] == "body_too_large"
        # and the frontend still serves
        status, _ = await post(url, "/v1/completions", completion())
        assert status == 200


async def test_no_worker_is_503_stream_and_unary() -> None:
    fleet = FakeFleet()
    async with frontend(fleet) as url:
        for stream in (False, True):
            status, raw = await post(url, "/v1/completions", completion(stream=stream))
            assert status == 503
            assert orjson.loads(raw)["error"]["code"] == "no_worker"


@pytest.mark.parametrize(
    ("kind", "status"),
    [("engine_error", 500), ("invalid_request", 400), ("retryable", 503)],
)
async def test_engine_errors_before_first_token_get_their_status(kind: str, status: int) -> None:
    fleet = FakeFleet(FakeWorker("w0", behavior=error_behavior(kind, status)))
    async with frontend(fleet) as url:
        for stream in (False, True):
            got, raw = await post(url, "/v1/completions", completion(stream=stream))
            assert got == status
            err = orjson.loads(raw)["error"]
            assert err["code"] == kind and "w0" in err["message"]


async def test_error_mid_stream_is_an_error_event_then_done() -> None:
    fleet = FakeFleet(
        FakeWorker("w0", behavior=error_behavior("engine_error", 500, after_tokens=2))
    )
    async with frontend(fleet) as url:
        status, raw = await post(url, "/v1/completions", completion(stream=True))
        assert status == 200
        events = sse_events(raw)
        assert [e["choices"][0]["text"] for e in events[:2]] == ["<token:200> ", "<token:201> "]
        assert events[2]["error"]["code"] == "engine_error"
        assert events[3] == "[DONE]" and len(events) == 4
        # the unary form of the same failure is a plain 500
        status, raw = await post(url, "/v1/completions", completion())
        assert status == 500


async def test_retryable_error_migrates_to_another_worker() -> None:
    bad = FakeWorker("a-bad", behavior=error_behavior("retryable", 503, after_tokens=2))
    good = FakeWorker("b-good")
    fleet = FakeFleet(bad, good)
    async with frontend(fleet, migration_limit=1) as url:
        for _ in range(2):  # round-robin: one request starts on each worker
            status, raw = await post(url, "/v1/completions", completion(stream=True))
            assert status == 200
            events = sse_events(raw)
            assert all("error" not in e for e in events[:-1])
            text = "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"])
            assert len(text.split()) == 10
    migrated = [r for r in good.requests if r["request_id"].endswith("-m1")]
    assert len(migrated) == 1
    assert migrated[0]["token_ids"] == [1, 2, 3, 200, 201]
    assert migrated[0]["max_tokens"] == 8
    # without migration the retryable error reaches the client
    fleet2 = FakeFleet(FakeWorker("a-bad", behavior=error_behavior("retryable", 503)))
    async with frontend(fleet2) as url:
        status, _ = await post(url, "/v1/completions", completion())
        assert status == 503


async def test_unreachable_worker_is_skipped() -> None:
    down = FakeWorker("a-down", refuse_connect=True)
    fleet = FakeFleet(down, FakeWorker("b-up"))
    async with frontend(fleet) as url:
        for _ in range(4):
            status, _ = await post(url, "/v1/completions", completion())
            assert status == 200
        assert len(fleet.workers["b-up"].requests) == 4
        fleet.workers["b-up"].refuse_connect = True
        status, raw = await post(url, "/v1/completions", completion())
        assert status == 503
        assert "could not connect" in orjson.loads(raw)["error"]["message"]


async def test_client_disconnect_mid_stream_cancels_the_stream() -> None:
    worker = FakeWorker("w0", behavior=stall_behavior(tokens_first=1))
    fleet = FakeFleet(worker)
    async with frontend(fleet) as url:
        async with aiohttp.ClientSession() as session:
            resp = await session.post(url + "/v1/completions", json=completion(stream=True))
            assert resp.status == 200
            await resp.content.readuntil(b"\n\n")  # the first token arrived
            resp.close()  # the client goes away
        await asyncio.wait_for(worker.streams[0].cancelled.wait(), 5)
        # the frontend counted it as cancelled
        _, raw = await get(url, "/metrics")
        text = raw.decode()
        assert 'outcome="cancelled",worker="w0"} 1' in text
        assert "lab_frontend_inflight_requests 0" in text


async def test_client_disconnect_non_stream_cancels_the_stream() -> None:
    worker = FakeWorker("w0", behavior=stall_behavior(tokens_first=1))
    fleet = FakeFleet(worker)
    async with frontend(fleet) as url:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(asyncio.TimeoutError):
                await session.post(
                    url + "/v1/completions",
                    json=completion(),
                    timeout=aiohttp.ClientTimeout(total=0.3),
                )
        await asyncio.wait_for(worker.streams[0].cancelled.wait(), 5)


# --- routing and discovery ---------------------------------------------------------------------


async def test_round_robin_spreads_requests() -> None:
    fleet = FakeFleet(FakeWorker("w0"), FakeWorker("w1"), FakeWorker("w2"))
    async with frontend(fleet) as url:
        for _ in range(9):
            await post(url, "/v1/completions", completion(max_tokens=1))
    assert [len(w.requests) for w in fleet.workers.values()] == [3, 3, 3]


async def test_least_loaded_uses_published_load() -> None:
    busy = FakeWorker("w0", load={"running_requests": 50, "queued_requests": 3})
    idle = FakeWorker("w1", load={"running_requests": 1})
    fleet = FakeFleet(busy, idle)
    async with frontend(fleet, router="least-loaded") as url:
        for _ in range(5):
            await post(url, "/v1/completions", completion(max_tokens=1))
    assert len(idle.requests) == 5 and not busy.requests


async def test_worker_leaving_discovery_gets_no_more_requests() -> None:
    fleet = FakeFleet(FakeWorker("w0"), FakeWorker("w1"))
    async with frontend(fleet) as url:
        fleet.remove("w0")
        await asyncio.sleep(0.05)
        for _ in range(4):
            status, _ = await post(url, "/v1/completions", completion(max_tokens=1))
            assert status == 200
        assert len(fleet.workers["w1"].requests) == 4
        # its idle client was closed
        await wait_for(lambda: any(c.closed and c.address == "fake:w0" for c in fleet.clients))
        fleet.remove("w1")
        await asyncio.sleep(0.05)
        status, _ = await post(url, "/v1/completions", completion())
        assert status == 503


# --- health, models, metrics, logging, sockets -------------------------------------------------


async def get(url: str, path: str) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.get(url + path) as resp:
        return resp.status, await resp.read()


async def test_health_live_models_metrics() -> None:
    fleet = FakeFleet()
    async with frontend(fleet, expect={"prefill": 1, "decode": 1}) as url:
        assert (await get(url, "/live"))[0] == 200
        assert (await get(url, "/health"))[0] == 503
        fleet.add(FakeWorker("p0", role="prefill"))
        await asyncio.sleep(0.05)
        assert (await get(url, "/health"))[0] == 503
        fleet.add(FakeWorker("d0", role="decode"))
        await asyncio.sleep(0.05)
        status, raw = await get(url, "/health")
        assert status == 200
        assert orjson.loads(raw)["workers"] == {"aggregated": 0, "prefill": 1, "decode": 1}
        status, raw = await get(url, "/v1/models")
        assert [m["id"] for m in orjson.loads(raw)["data"]] == [MODEL]
        await post(url, "/v1/completions", completion(stream=True))
        await post(url, "/v1/completions", completion(model="nope"))
        status, raw = await get(url, "/metrics")
        text = raw.decode()
        assert (
            'lab_frontend_requests_total{endpoint="completions",outcome="success",worker="d0"} 1'
            in text
        )
        assert 'outcome="not_found",worker="none"} 1' in text
        assert 'lab_frontend_ttft_seconds_count{worker="d0"} 1' in text
        assert 'lab_frontend_inter_token_seconds_count{worker="d0"} 9' in text
        assert 'lab_frontend_workers{role="prefill"} 1' in text
    async with frontend(FakeFleet()) as url:
        assert (await get(url, "/health"))[0] == 503  # default: at least one worker
    async with frontend(FakeFleet(FakeWorker("w"))) as url:
        assert (await get(url, "/health"))[0] == 200


async def test_health_is_degraded_while_a_worker_still_serves() -> None:
    """Fewer workers than expected but one that serves: 200 "degraded" (a load balancer keeps
    the frontend); none that can serve: 503 "unhealthy"."""
    fleet = FakeFleet(FakeWorker("w0"), FakeWorker("w1"))
    async with frontend(fleet, expect={"aggregated": 2}) as url:
        status, raw = await get(url, "/health")
        assert (status, orjson.loads(raw)["status"]) == (200, "healthy")
        fleet.remove("w1")
        await wait_for_health(url, "degraded")
        assert (await get(url, "/health"))[0] == 200
        fleet.remove("w0")
        await wait_for_health(url, "unhealthy")
        assert (await get(url, "/health"))[0] == 503
    # prefill alone cannot serve a request
    async with frontend(FakeFleet(FakeWorker("p0", role="prefill")),
                        expect={"prefill": 1, "decode": 1}) as url:
        status, raw = await get(url, "/health")
        assert (status, orjson.loads(raw)["status"]) == (503, "unhealthy")


async def wait_for_health(url: str, state: str, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while orjson.loads((await get(url, "/health"))[1])["status"] != state:
            await asyncio.sleep(0.02)


async def test_one_log_line_per_request_names_both_workers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fleet = FakeFleet(FakeWorker("p0", role="prefill"), FakeWorker("d0", role="decode"))
    caplog.set_level(logging.INFO, logger="lab.frontend")
    async with frontend(fleet) as url:
        await post(url, "/v1/completions", completion(stream=True))
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("request ")]
    assert len(lines) == 1
    assert "prefill_worker=p0" in lines[0] and "decode_worker=d0" in lines[0]
    assert "completion_tokens=10" in lines[0] and "status=200" in lines[0]


@pytest.mark.parametrize("nodelay", [True, False])
async def test_http_nodelay_reaches_accepted_socket(nodelay: bool) -> None:
    fleet = FakeFleet(FakeWorker("w0"))
    async with frontend(fleet, http_nodelay=nodelay,
                        debug_endpoints=True) as url:
        status, raw = await get(url, "/debug/conn")
    assert status == 200
    assert orjson.loads(raw)["tcp_nodelay"] == int(nodelay)


async def test_sigterm_style_stop_finishes_in_flight_requests() -> None:
    worker = FakeWorker("w0", delay_s=0.02)
    fleet = FakeFleet(worker)
    config = fleet_settings(shutdown_grace=5)
    server = FrontendServer(config, registry=fleet, client_factory=fleet.client_factory)
    stop = asyncio.Event()
    ready = asyncio.Event()
    async with asyncio.TaskGroup() as tg:
        tg.create_task(server.serve(stop, lambda _a: ready.set()))
        await ready.wait()
        await server.workers.synced.wait()
        url = f"http://{server.address}"
        request = tg.create_task(post(url, "/v1/completions", completion(stream=True)))
        await wait_for(lambda: len(worker.requests) == 1)
        stop.set()
    status, raw = request.result()
    assert status == 200
    assert sse_events(raw)[-1] == "[DONE]"
    assert all(c.closed for c in fleet.clients)


async def test_a_failed_only_prefill_worker_falls_back_to_aggregated_decode() -> None:
    """The only prefill worker refuses (its engine stalled; discovery has not caught up yet):
    the request is served aggregated by the decode worker instead of failing with 503."""
    fleet = FakeFleet(
        FakeWorker("p0", role="prefill", behavior=error_behavior("unavailable", 503)),
        FakeWorker("d0", role="decode"),
    )
    async with frontend(fleet, migration_limit=0) as url:
        status, raw = await post(url, "/v1/completions", completion())
    assert status == 200, raw
    (sent,) = fleet.workers["d0"].requests
    assert sent["handoff"] is None  # aggregated: no prefill handoff
    assert len(fleet.workers["p0"].requests) == 1
