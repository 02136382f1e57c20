"""Open an HTML file in Debian's headless Chromium and report what a reader's browser saw: each
<img> (loaded, natural size), console errors and uncaught exceptions, every URL the page asked
for, and a screenshot. Driven over the DevTools protocol (aiohttp's websocket client): Chromium
binds its debugging port itself (--remote-debugging-port=0) and prints it on stderr."""

from __future__ import annotations

import asyncio
import base64
import itertools
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.procs import Proc, start

CHROMIUM = "chromium"
_LISTENING = re.compile(r"DevTools listening on (ws://\S+)")


def chromium_or_skip() -> str:
    """The chromium binary; skipped when it is missing, except under CI=true (.ci/run installs
    Debian's package), where a missing browser fails like the other provisioned tools."""
    path = shutil.which(CHROMIUM)
    if path:
        return path
    reason = f"{CHROMIUM} not on PATH (Debian's package: apt-get install chromium)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI installs it in .ci/run", pytrace=False)
    pytest.skip(reason)


@dataclass
class PageSeen:
    images: list[dict[str, Any]]  # {"alt", "complete", "width", "height"} per <img>
    errors: list[str]  # console errors, uncaught exceptions, failed loads
    urls: list[str]  # every request the page made (the document itself included)
    text: str  # document.body.innerText
    screenshot: bytes = field(repr=False, default=b"")


async def _open(ws_url: str, page_url: str, timeout: float) -> PageSeen:
    ids = itertools.count(1)
    errors: list[str] = []
    urls: list[str] = []
    async with aiohttp.ClientSession() as http:
        host = ws_url.split("/")[2]
        async with http.get(f"http://{host}/json/list") as r:
            targets = await r.json(content_type=None)
        page = next(t for t in targets if t.get("type") == "page")
        async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            loaded = asyncio.Event()
            pending: dict[int, asyncio.Future] = {}

            async def reader() -> None:
                async for msg in ws:
                    data = msg.json()
                    if "id" in data and data["id"] in pending:
                        pending.pop(data["id"]).set_result(data)
                        continue
                    method, params = data.get("method"), data.get("params", {})
                    if method == "Page.loadEventFired":
                        loaded.set()
                    elif method == "Runtime.exceptionThrown":
                        errors.append(f"exception: {params['exceptionDetails'].get('text')}")
                    elif method == "Runtime.consoleAPICalled" and params.get("type") in (
                            "error", "assert"):
                        errors.append(f"console.{params['type']}: {params.get('args')}")
                    elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                        errors.append(f"log: {params['entry'].get('text')} "
                                      f"{params['entry'].get('url', '')}")
                    elif method == "Network.requestWillBeSent":
                        urls.append(params["request"]["url"])
                    elif method == "Network.loadingFailed":
                        errors.append(f"load failed: {params.get('errorText')}")

            async def call(method: str, **params: Any) -> dict:
                i = next(ids)
                fut: asyncio.Future = asyncio.get_running_loop().create_future()
                pending[i] = fut
                await ws.send_json({"id": i, "method": method, "params": params})
                reply = await asyncio.wait_for(fut, timeout)
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

            task = asyncio.create_task(reader())
            try:
                for domain in ("Page", "Runtime", "Log", "Network"):
                    await call(f"{domain}.enable")
                await call("Emulation.setDeviceMetricsOverride", width=1280, height=900,
                           deviceScaleFactor=1, mobile=False)
                await call("Page.navigate", url=page_url)
                await asyncio.wait_for(loaded.wait(), timeout)
                result = await call("Runtime.evaluate", returnByValue=True, expression=(
                    "({images: Array.from(document.images).map(i => ({alt: i.alt, "
                    "complete: i.complete, width: i.naturalWidth, height: i.naturalHeight})), "
                    "text: document.body.innerText})"))
                value = result["result"]["value"]
                shot = await call("Page.captureScreenshot", format="png",
                                  captureBeyondViewport=True)
            finally:
                task.cancel()
    return PageSeen(images=value["images"], errors=errors, urls=urls, text=value["text"],
                    screenshot=base64.b64decode(shot["data"]))


def open_in_chromium(path: Path, timeout: float = 60.0) -> PageSeen:
    """Load `path` (file://) in a fresh headless Chromium; the browser is stopped afterwards."""
    binary = chromium_or_skip()
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        proc: Proc = start("chromium", [
            binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-dev-shm-usage", "--remote-debugging-port=0",
            "--remote-debugging-address=127.0.0.1", f"--user-data-dir={profile}",
            "about:blank"], Path(profile) / "logs")
        try:
            ws_url = _wait_listening(proc, timeout)
            return asyncio.run(_open(ws_url, path.resolve().as_uri(), timeout))
        finally:
            proc.stop()


def _wait_listening(proc: Proc, timeout: float) -> str:
    proc.wait_log("DevTools listening on", timeout)
    m = _LISTENING.search(proc.log())
    assert m, proc.log()
    if proc.popen.poll() is not None:
        raise subprocess.SubprocessError(f"chromium exited:\n{proc.log()[-2000:]}")
    return m.group(1)
