"""Hostile input through the real path (frontend, sidecar and mocker processes): the inputs that
used to give a 500 or a multi-GB prompt get a 400 at the frontend, nothing reaches the engine,
and the frontend's memory stays in proportion."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import aiohttp
import psutil

from tests.procs import Proc, frontend_argv, mocker_argv, sidecar_argv
from tests.serve.test_frontend_process import wait_http

MODEL = "mocker-model"
CONTEXT = 512
BIG = 2**64


async def test_hostile_inputs_get_400_over_the_real_path(
    spawn: Callable[..., Proc], tmp_path: Path
) -> None:
    disc = str(tmp_path / "disc")
    engine = spawn("engine-0", mocker_argv("--context-length", str(CONTEXT), "--record-requests",
                                           role="aggregated", instance_id="engine-0-h",
                                           speedup=1000.0))
    sidecar = spawn("sidecar-0", sidecar_argv(engine.address, disc, "sidecar-0"), ready=False)
    fe = spawn("frontend", frontend_argv(disc, "--expect", "aggregated=1"))
    sidecar.wait_ready(30)
    url = f"http://{fe.address}"
    # the context limit comes from discovery: wait until the frontend has seen the worker
    await wait_http(url, "/health", timeout=60)

    def completion(**kw: object) -> bytes:
        return json.dumps({"model": MODEL, "prompt": "a b", "max_tokens": 2, **kw}).encode()

    cases = [
        ("big token id in text", completion(prompt=f"a <token:{BIG}>"), {}, "prompt"),
        ("big token id in an array", completion(prompt=[1, BIG]), {}, "prompt"),
        ("big stop", completion(stop=f"<token:{BIG}>"), {}, "stop"),
        ("big max_tokens", completion(max_tokens=BIG), {}, "max_tokens"),
        ("corrupt gzip", b"\x1f\x8b\x08\x00not-deflate", {"Content-Encoding": "gzip"},
         "unreadable"),
        ("prompt beyond the context", completion(prompt="x " * CONTEXT), {}, "context length"),
        ("10 MB prompt", completion(prompt="x " * 5_000_000), {}, "context length"),
    ]
    rss_before = psutil.Process(fe.pid).memory_info().rss
    async with aiohttp.ClientSession() as session:
        chat = json.dumps({"model": MODEL, "messages": [
            {"role": "user", "content": f"<token:{BIG}>"}]}).encode()
        cases.append(("big token id in chat", chat, {}, "messages"))
        for name, body, headers, text in cases:
            path = "/v1/chat/completions" if "chat" in name else "/v1/completions"
            async with session.post(url + path, data=body, headers={
                    "Content-Type": "application/json", **headers}) as resp:
                got = await resp.read()
                assert resp.status == 400 and text.encode() in got, (name, resp.status, got)
        rss_after = psutil.Process(fe.pid).memory_info().rss
        async with session.post(url + "/v1/completions", data=completion(),
                                headers={"Content-Type": "application/json"}) as resp:
            assert resp.status == 200  # still serving
        async with session.get(url + "/metrics") as resp:
            metrics = await resp.text()
    assert (rss_after - rss_before) < 300 * 2**20, (rss_before, rss_after)
    assert 'outcome="invalid"' in metrics and "internal_error" not in metrics
    for proc in (fe, sidecar, engine):
        assert "Traceback" not in proc.log(), proc.name
