"""The frontend process: bind HTTP, follow discovery, serve until told to stop.

Shutdown (SIGTERM/SIGINT -> `stop` set): the listener closes (no new connections), idle
keep-alive connections close, in-flight requests get `shutdown_grace` seconds to finish (then
they are cancelled, which cancels their request-plane streams), the discovery loops stop, and
the request-plane clients close.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from lab.serve.discovery import Registry, open_registry
from lab.serve.frontend.app import FrontendApp
from lab.serve.frontend.dispatch import Dispatcher
from lab.serve.frontend.httplog import RateLimitedLog, install_bad_request_filter
from lab.serve.frontend.workers import ClientFactory, WorkerSet
from lab.serve.router import make_router
from lab.serve.tokenizer import Tokenizer, load_tokenizer
from lab.shared.frontend_settings import FrontendSettings
from lab.wire.address import split_address

log = logging.getLogger("lab.frontend")


def apply_http_nodelay(server: web.Server, on: bool) -> None:
    """Set TCP_NODELAY explicitly (both ways) on every accepted HTTP connection.

    aiohttp forces TCP_NODELAY=1 when a connection is made; the server's `connection_made`
    hook runs right after that, so the configured value is what the socket ends up with.
    """
    original = server.connection_made
    value = 1 if on else 0

    def connection_made(handler: Any, transport: Any) -> None:
        original(handler, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, value)
            except OSError:
                pass

    server.connection_made = connection_made  # type: ignore[method-assign]


_REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: application/json"
    b"\r\nContent-Length: %d\r\n\r\n%s"
)


def apply_connection_cap(server: web.Server, cap: int) -> None:
    """Past `cap` open connections, a new one gets a 503 and is closed at once."""
    original = server.connection_made
    refused_log = RateLimitedLog(log, per_s=0.2, burst=3)

    def connection_made(handler: Any, transport: Any) -> None:
        original(handler, transport)
        if len(server._connections) > cap:  # no public count (server.connections copies)
            body = (
                b'{"error":{"message":"too many connections (the limit is %d)",'
                b'"type":"service_unavailable","param":null,"code":"too_many_connections"}}'
                % cap
            )
            transport.write(_REFUSED % (len(body), body))
            handler.force_close()
            transport.close()
            refused_log.warning("connection cap of %d reached: refusing new connections", cap)

    server.connection_made = connection_made  # type: ignore[method-assign]


class FrontendServer:
    def __init__(
        self,
        config: FrontendSettings,
        *,
        registry: Registry | None = None,
        client_factory: ClientFactory | None = None,
        tokenizer: Tokenizer | None = None,
    ) -> None:
        self.config = config
        if registry is None:
            registry = open_registry(config.discovery, ttl_s=config.discovery_ttl)
        self.registry = registry
        self.workers = WorkerSet(self.registry, config.sockets, client_factory)
        self.dispatcher = Dispatcher(
            self.workers,
            make_router(config.router),
            served_model=config.model_name,
            enforce_disagg=config.enforce_disagg,
            migration_limit=config.migration_limit,
        )
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(
            config.tokenizer, special_tokens=config.add_special_tokens)
        self.app = FrontendApp(config, self.workers, self.dispatcher, self.tokenizer)
        self.address: str | None = None

    async def serve(
        self, stop: asyncio.Event, on_ready: Callable[[str], None] | None = None
    ) -> None:
        cfg = self.config
        install_bad_request_filter()
        runner = web.AppRunner(
            self.app.build(),
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=cfg.shutdown_grace,
            keepalive_timeout=cfg.idle_timeout,
            # Bodies are decompressed by FrontendApp (bounded, errors as 400), not by the parser.
            auto_decompress=False,
        )
        await runner.setup()
        apply_http_nodelay(runner.server, cfg.sockets.http_nodelay)  # type: ignore[arg-type]
        apply_connection_cap(runner.server, cfg.max_connections)  # type: ignore[arg-type]
        host, port = split_address(cfg.listen, allow_port_zero=True)
        site = web.TCPSite(runner, host, port, backlog=1024)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            await self.registry.close()
            raise
        host, port = runner.addresses[0][:2]
        self.address = f"{host}:{port}"
        try:
            async with asyncio.TaskGroup() as tg:
                loops = [
                    tg.create_task(self.workers.watch()),
                    tg.create_task(self.workers.janitor()),
                ]
                try:
                    if on_ready is not None:
                        on_ready(self.address)
                    await stop.wait()
                    log.info(
                        "stopping: no new connections, %d request(s) in flight",
                        self.app.metrics.inflight,
                    )
                finally:
                    await runner.cleanup()
                    for task in loops:
                        task.cancel()
        finally:
            self.app.close()
            await self.workers.close()
            await self.registry.close()


@contextlib.asynccontextmanager
async def running(server: FrontendServer) -> AsyncIterator[str]:
    """Run `server` in this loop (tests): yields "http://host:port", stops it on exit."""
    stop = asyncio.Event()
    ready = asyncio.Event()
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(server.serve(stop, lambda _addr: ready.set()))
        ready_wait = tg.create_task(ready.wait())
        await asyncio.wait([task, ready_wait], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            ready_wait.cancel()
            task.result()
        try:
            yield f"http://{server.address}"
        finally:
            stop.set()
