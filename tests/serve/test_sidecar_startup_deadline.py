"""The sidecar's start-up wait for an engine whose port refuses: the reason it gives at the
deadline is the engine's, however the deadline falls between attempts."""

from __future__ import annotations

import time

import uvloop

from lab.serve.sidecar.engine import EngineLink, StartupError
from launch.port_hold import PortHold


def _wait_out(target: str, deadline_s: float, retry_s: float) -> str:
    async def run() -> str:
        link = EngineLink(target)
        try:
            await link.handshake(time.monotonic() + deadline_s, 5.0, retry_s)
        except StartupError as exc:
            return str(exc)
        finally:
            await link.close()
        raise AssertionError("the handshake succeeded against a port that refuses")
    return uvloop.run(run())


def test_the_deadline_ends_the_wait_with_the_engines_refusal() -> None:
    """uvloop (the sidecar's loop) keeps timers in whole milliseconds, so the last sleep before
    the deadline can end a fraction of a millisecond early. No attempt may start in what is
    left: it would time out in microseconds and give "no TCP answer within 6e-05 s" as the
    reason instead of "connection refused". Many short waits, so that an early wake-up comes."""
    with PortHold() as hold:
        target = f"127.0.0.1:{hold.port}"
        for _ in range(30):
            message = _wait_out(target, 0.1, 0.02)
            assert "start-up deadline (connection refused since" in message, message


def test_a_deadline_passed_before_the_first_attempt_still_gets_the_engines_reason() -> None:
    """A start that stalls past its deadline (a loaded machine) still tries the engine once, so
    that the error says why the engine is not there."""
    with PortHold() as hold:
        message = _wait_out(f"127.0.0.1:{hold.port}", -1.0, 0.02)
        assert "start-up deadline (connection refused since" in message, message
