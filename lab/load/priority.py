"""Real-time scheduling for the load client's processes (`--client-realtime`).

Beside a server that keeps the machine's cores busy (vLLM's EngineCore and Worker each hold a
core while they serve), a normal-priority client can wait for a core long after its socket
becomes readable, and that wait lands in the TTFT and ITL it stamps (docs/fidelity.md "The
client's scheduling"; the figures: docs/measurements.md). The client's own CPU is a few percent
of a core, so the lowest real-time level costs the server next to nothing; the kernel's
real-time throttling (sched_rt_runtime_us) still bounds it if a level ever saturates the client.
"""

from __future__ import annotations

import ipaddress
import os
from typing import Any
from urllib.parse import urlsplit

#: The lowest real-time priority: above every normal process, below anything real-time.
CLIENT_RT_PRIORITY = 1
#: What client.json says of a client process's scheduling.
NORMAL, REALTIME = "normal", "realtime"


class RealtimeRefused(RuntimeError):
    """The kernel refused real-time scheduling (not root and no CAP_SYS_NICE)."""


def make_realtime() -> str:
    """Put the calling thread (a client process's main thread, before its event loop starts)
    on SCHED_RR at CLIENT_RT_PRIORITY; processes it starts get normal scheduling back
    (SCHED_RESET_ON_FORK). Returns REALTIME; raises RealtimeRefused naming the option."""
    try:
        os.sched_setscheduler(0, os.SCHED_RR | os.SCHED_RESET_ON_FORK,
                              os.sched_param(CLIENT_RT_PRIORITY))
    except PermissionError as exc:
        raise RealtimeRefused(
            "--client-realtime: the kernel refused real-time scheduling (SCHED_RR) for the "
            f"load client ({exc.strerror}): run as root or with CAP_SYS_NICE, or drop the "
            "option") from None
    return REALTIME


def client_scheduling(realtime: bool, conn: Any) -> str | None:
    """A client process's scheduling, before it says "ready" on `conn`: real-time when asked
    (else as it is). Where the kernel refuses, the refusal goes to the parent on `conn`, which
    fails the level with it before anything is sent, and None comes back: the child ends."""
    try:
        return make_realtime() if realtime else scheduling()
    except RealtimeRefused as exc:
        conn.send(str(exc))
        return None


def scheduling() -> str:
    """How the calling thread is scheduled: REALTIME or NORMAL."""
    policy = os.sched_getscheduler(0) & ~os.SCHED_RESET_ON_FORK
    return REALTIME if policy in (os.SCHED_RR, os.SCHED_FIFO) else NORMAL


def on_this_machine(url: str) -> bool:
    """Whether `url`'s host is this machine's loopback (where the server shares the client's
    cores); a name other than localhost is not resolved and counts as elsewhere."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
