"""The launcher's frontend readiness: ready only when /health says "healthy" (a 200 "degraded"
frontend serves, but the stack is not up until every expected worker registered)."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Iterator

import pytest

from launch.readiness import frontend_healthy


@contextlib.contextmanager
def health_server(status: int, body: dict) -> Iterator[str]:
    payload = json.dumps(body).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(("status", "state", "ready"), [
    (200, "healthy", True), (200, "degraded", False), (503, "unhealthy", False)])
async def test_the_frontend_is_ready_only_when_healthy(status: int, state: str,
                                                        ready: bool) -> None:
    with health_server(status, {"status": state, "workers": {}}) as address:
        ok, detail = await frontend_healthy(address)
    assert ok is ready, detail
    assert state in detail
