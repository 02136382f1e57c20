"""What the tests' fake OpenAI servers (fake_openai.py, strict_openai.py) share: an aiohttp app
that serves one model at /v1/models, serving it on a loopback port, and running as a process that
prints a ready line and serves until it is interrupted."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

from lab.wire.ready import format_ready


@dataclass(kw_only=True, eq=False)
class FakeServer:
    """An aiohttp app serving `model`: GET /v1/models lists it (404 without `models_endpoint`);
    a subclass adds its routes to `app` in __post_init__ (after calling this one's)."""

    model: str
    models_endpoint: bool = True
    app: web.Application = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.app = web.Application()
        if self.models_endpoint:
            self.app.router.add_get("/v1/models", self.models)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list",
                                  "data": [{"id": self.model, "object": "model"}]})


async def start(server: FakeServer, port: int = 0) -> tuple[web.AppRunner, str]:
    """Serve `server.app` on 127.0.0.1:`port` (0: any free port); the runner and the base URL."""
    runner = web.AppRunner(server.app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    sock = site._server.sockets[0]  # type: ignore[union-attr]
    host, bound = sock.getsockname()[:2]
    return runner, f"http://{host}:{bound}"


def serve_forever(make: Callable[[], FakeServer], port: int, ident: str) -> None:
    """Run as a process: serve `make()` on `port`, print its ready line, serve until interrupted."""

    async def run() -> None:
        runner, url = await start(make(), port)
        print(format_ready("frontend", ident, url.removeprefix("http://")), file=sys.stderr,
              flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
