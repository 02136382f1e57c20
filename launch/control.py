"""A run's control channel: request/response files in <run_dir>/control/.

`lab fault RUN ...` (another shell) writes req-<id>.json; the supervisor polls the directory,
performs the request through the same code as Stack.fault() (so the fault event is recorded by
the supervisor and `restart` is known to be requested), and answers with resp-<id>.json.
Files, not sockets: nothing to bind, no path-length limit, survives any working directory.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

CONTROL_DIR = "control"
POLL_S = 0.1


def _write_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


async def serve_control(
    run_dir: Path, handler: Callable[[dict[str, Any]], Awaitable[str]]
) -> None:
    """Answer requests until cancelled. handler(request) -> message, or raises (-> error)."""
    directory = run_dir / CONTROL_DIR
    directory.mkdir(parents=True, exist_ok=True)
    while True:
        for path in sorted(directory.glob("req-*.json")):
            ident = path.stem.removeprefix("req-")
            try:
                request = json.loads(path.read_text())
            except (OSError, ValueError):
                continue  # half-written: next round
            path.unlink(missing_ok=True)
            try:
                reply = {"ok": True, "message": await handler(request)}
            except Exception as exc:  # any failure is the requester's answer
                reply = {"ok": False, "error": str(exc) or type(exc).__name__}
            _write_atomic(directory / f"resp-{ident}.json", reply)
        await asyncio.sleep(POLL_S)


def send_request(run_dir: Path, request: dict[str, Any], timeout_s: float = 15.0,
                 alive: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Write a request and wait for its answer; TimeoutError if none comes in time."""
    directory = run_dir / CONTROL_DIR
    directory.mkdir(parents=True, exist_ok=True)
    ident = f"{os.getpid()}-{secrets.token_hex(4)}"
    _write_atomic(directory / f"req-{ident}.json", request)
    response = directory / f"resp-{ident}.json"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if response.exists():
            try:
                reply = json.loads(response.read_text())
            except ValueError:
                time.sleep(POLL_S / 2)
                continue
            response.unlink(missing_ok=True)
            return reply
        if alive is not None and not alive():
            break
        time.sleep(POLL_S / 2)
    (directory / f"req-{ident}.json").unlink(missing_ok=True)
    raise TimeoutError(f"the supervisor of {run_dir} did not answer within {timeout_s:g} s")
