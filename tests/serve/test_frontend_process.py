"""The `lab frontend` process with file discovery and the real request plane, driven by the
official openai client. The workers are in-test RequestPlaneServers (no engines needed here;
test_path_*.py runs the full path with sidecars and mockers)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from click.testing import CliRunner

from lab.serve.discovery import WorkerRecord
from lab.serve.discovery.file_store import FileRegistry
from lab.serve.frontend.cli import frontend as frontend_cmd
from lab.serve.request_plane import RequestPlaneServer, StreamSink
from lab.shared.settings import DiscoveryTiming

LAB = ["python", "-c", "from lab.cli import main; main()"]
MODEL = "mocker-model"
Handler = Callable[[dict, StreamSink], Awaitable[None]]


def end_payload(worker_id: str, n: int, prompt: int, finish: str = "length") -> dict[str, Any]:
    return {
        "finish": finish,
        "stop_reason": None,
        "usage": {"prompt_tokens": prompt, "completion_tokens": n, "cached_tokens": 0},
        "handoff": None,
        "error": None,
        "worker_id": worker_id,
    }


def token_handler(worker_id: str, per_iteration_sleep: float = 0.0) -> Handler:
    async def handler(req: dict, sink: StreamSink) -> None:
        n = req["max_tokens"] or 16
        for i in range(n):
            sink.chunk({"t": [100 + i]})
            await asyncio.sleep(per_iteration_sleep)
        sink.end(end_payload(worker_id, n, len(req["token_ids"])))

    return handler


@contextlib.asynccontextmanager
async def rp_worker(
    directory: Path, worker_id: str, handler: Handler, heartbeat: bool = True, age_s: float = 0.0
) -> AsyncIterator[RequestPlaneServer]:
    """A request-plane worker registered in `directory` (aged by `age_s` when not heartbeating)."""
    server = RequestPlaneServer(handler)
    address = await server.start("127.0.0.1", 0)
    registry = FileRegistry(directory)
    record = WorkerRecord(
        worker_id=worker_id, role="aggregated", address=address, model=MODEL, context_length=4096
    )
    await registry.register(record)
    if age_s:
        data = record.to_json()
        data["updated_at"] = time.time() - age_s
        (directory / f"{worker_id}.json").write_bytes(orjson.dumps(data))

    async def beat() -> None:
        while True:
            await asyncio.sleep(DiscoveryTiming.heartbeat_s)
            await registry.refresh(record)

    try:
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(beat()) if heartbeat else None
            try:
                yield server
            finally:
                if task is not None:
                    task.cancel()
    finally:
        await registry.withdraw(worker_id)
        await server.close()


async def wait_http(url: str, path: str, status: int = 200, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while True:
            async with session.get(url + path) as resp:
                if resp.status == status:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path} never returned {status}")
            await asyncio.sleep(0.05)


def start_frontend(spawn: Callable[..., Any], directory: Path, *extra: str) -> tuple[Any, str]:
    proc = spawn(
        "frontend",
        [*LAB, "frontend", "--listen", "127.0.0.1:0", "--discovery", f"file:{directory}", *extra],
    )
    return proc, f"http://{proc.address}"


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=20)


async def test_openai_client_through_real_request_plane(spawn: Any, tmp_path: Path) -> None:
    disc = tmp_path / "disc"
    disc.mkdir()
    proc, url = start_frontend(spawn, disc, "--expect", "aggregated=1")
    await wait_http(url, "/live")
    await wait_http(url, "/health", 503)
    async with rp_worker(disc, "w0", token_handler("w0")):
        await wait_http(url, "/health")
        oa = client(url)
        stream = await oa.completions.create(
            model=MODEL,
            prompt="one two three",
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True, "nvext": {"extra_fields": ["worker_id"]}},
        )
        text, usage, nvext = "", None, None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].text
                extra = chunk.model_extra or {}
                nvext = extra.get("nvext", nvext)
            if chunk.usage:
                usage = chunk.usage
        assert len(text.split()) == 12
        assert usage is not None and usage.completion_tokens == 12 and usage.prompt_tokens == 3
        assert nvext["worker_id"]["decode_worker_id"] == "w0"

        out = await oa.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi there"}], max_tokens=5
        )
        assert len(out.choices[0].message.content.split()) == 5
        assert out.usage.completion_tokens == 5
        models = await oa.models.list()
        assert [m.id for m in models.data] == [MODEL]
        with pytest.raises(openai.NotFoundError):
            await oa.completions.create(model="other", prompt="x", max_tokens=1)
        with pytest.raises(openai.BadRequestError) as info:
            await oa.completions.create(model=MODEL, prompt="x", max_tokens=-3)
        assert "max_tokens" in str(info.value)
        await oa.close()
    proc.wait_log("worker left: w0")
    assert "request id=" in proc.log() and "decode_worker=w0" in proc.log()


async def test_client_disconnect_sends_cancel_to_the_worker(spawn: Any, tmp_path: Path) -> None:
    disc = tmp_path / "disc"
    disc.mkdir()
    cancelled = asyncio.Event()

    async def stalling(req: dict, sink: StreamSink) -> None:
        sink.chunk({"t": [1]})
        await sink.cancelled.wait()
        cancelled.set()
        sink.end(end_payload("w0", 1, 1, finish="cancelled"))

    _, url = start_frontend(spawn, disc)
    async with rp_worker(disc, "w0", stalling):
        await wait_http(url, "/health")
        oa = client(url)
        stream = await oa.completions.create(model=MODEL, prompt=[1, 2], max_tokens=50, stream=True)
        async for _chunk in stream:
            break  # one token arrived; now the client goes away
        await stream.close()
        await asyncio.wait_for(cancelled.wait(), 10)
        await oa.close()


async def test_expired_worker_gets_no_requests(spawn: Any, tmp_path: Path) -> None:
    disc = tmp_path / "disc"
    disc.mkdir()
    proc, url = start_frontend(spawn, disc)
    seen: list[str] = []

    def tracking(worker_id: str) -> Handler:
        inner = token_handler(worker_id)

        async def handler(req: dict, sink: StreamSink) -> None:
            seen.append(worker_id)
            await inner(req, sink)

        return handler

    ttl = DiscoveryTiming.ttl_s
    async with (
        rp_worker(disc, "a-live", tracking("a-live")),
        # never refreshed, and already 1.5 s from its TTL: it expires while the test runs
        rp_worker(disc, "b-stale", tracking("b-stale"), heartbeat=False, age_s=ttl - 1.5),
    ):
        await wait_http(url, "/health")
        proc.wait_log("worker joined: b-stale")
        proc.wait_log("worker left: b-stale", timeout=10)
        assert not (disc / "b-stale.json").exists()
        seen.clear()
        oa = client(url)
        for _ in range(4):
            out = await oa.completions.create(model=MODEL, prompt=[1], max_tokens=2)
            assert out.usage.completion_tokens == 2
        assert seen == ["a-live"] * 4
    # the last worker withdrew: 503
    proc.wait_log("worker left: a-live")
    with pytest.raises(openai.InternalServerError) as info:
        await oa.completions.create(model=MODEL, prompt=[1], max_tokens=2)
    assert info.value.status_code == 503
    await oa.close()


@pytest.mark.parametrize("nodelay", ["on", "off"])
async def test_http_nodelay_flag_on_the_process(spawn: Any, tmp_path: Path, nodelay: str) -> None:
    _, url = start_frontend(spawn, tmp_path / "disc", "--http-nodelay", nodelay,
                            "--debug-endpoints")
    async with aiohttp.ClientSession() as session, session.get(url + "/debug/conn") as resp:
        body = await resp.json()
    assert body["tcp_nodelay"] == (1 if nodelay == "on" else 0)


def test_sigterm_exits_zero_with_one_ready_line(spawn: Any, tmp_path: Path) -> None:
    proc, _ = start_frontend(spawn, tmp_path / "disc")
    proc.signal(signal.SIGTERM)
    assert proc.popen.wait(10) == 0
    log = proc.log()
    assert log.count("ready role=frontend id=frontend listen=127.0.0.1:") == 1
    assert "Traceback" not in log


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--discovery", "zk:/x"], "--discovery"),
        (["--discovery", "file:/tmp/x", "--expect", "gpu=1"], "--expect"),
        (["--discovery", "file:/tmp/x", "--router", "kv"], "--router"),
        (["--discovery", "file:/tmp/x", "--listen", "nowhere"], "--listen"),
        (["--discovery", "file:/tmp/x", "--tokenizer", "/no/such/file"], "--tokenizer"),
        (["--discovery", "file:/tmp/x", "--http-nodelay", "maybe"], "--http-nodelay"),
    ],
)
def test_cli_bad_input_exits_2_naming_it(args: list[str], needle: str) -> None:
    result = CliRunner().invoke(frontend_cmd, args)
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert "Traceback" not in result.output


def test_cli_help_documents_every_option() -> None:
    result = CliRunner().invoke(frontend_cmd, ["--help"])
    assert result.exit_code == 0
    for flag in (
        "--listen",
        "--discovery",
        "--router",
        "--client-nodelay",
        "--split-writes",
        "--pool-size",
        "--http-nodelay",
        "--enforce-disagg",
        "--migration-limit",
        "--expect",
        "--tokenizer",
        "--model-name",
        "--max-body-bytes",
        "--shutdown-grace",
    ):
        assert flag in result.output


async def test_debug_conn_is_served_only_when_asked(spawn: Any, tmp_path: Path) -> None:
    """/debug/conn tells anyone who reaches the port about its sockets: off by default."""
    _, url = start_frontend(spawn, tmp_path / "disc")
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "/debug/conn") as resp:
            assert resp.status == 404
        async with session.get(url + "/health") as resp:  # the frontend itself answers
            assert resp.status in (200, 503)
