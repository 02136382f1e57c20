"""After a level with cancelled requests (`--cancel`): did every process of the launched stack let
go of them? (docs/reliability.md "Cancellation under load".)

A cancelled request has to be released hop by hop: the frontend cancels its request-plane
stream, the sidecar cancels its Generate and aborts the engine request, the engine frees the
sequence's slot and KV blocks (for a disaggregated request, on the prefill engine too, whichever
leg was running). Anything missed stays held after the level: the check reads each process's own
account of what it holds, over the endpoints it already serves, until all are back to their idle
values or `settle_s` has passed:

* each engine: `Control.GetLoad` (running and queued requests, used KV blocks, open KV
  sessions, and the mocker's `open_streams` attribute: Generate streams not yet released);
* each sidecar: its discovery record's `in_flight` (request-plane streams in hand), from a
  heartbeat taken after the check began;
* the frontend: `/metrics` (`lab_frontend_inflight_requests` and the per-worker streams).

The idle values are the stack's own, read before the first level (`LeakCheck.baseline`). A
figure still off them when the wait ends is a leak, named by process and figure.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from lab.analysis.rundir import write_json
from lab.serve.discovery import open_registry
from lab.wire.constants import OPEN_STREAMS_ATTRIBUTE as OPEN_STREAMS
from launch.process import ProcessView
from launch.readiness import quiet_grpc_fork

#: How long the processes get to let go after a level (a sidecar reports at its heartbeat, 1 s
#: by default; an abort takes one engine pass).
DEFAULT_SETTLE_S = 10.0
POLL_S = 0.1
#: GetLoad's figures of an engine that hold something for a request (with the mocker's
#: OPEN_STREAMS attribute: the Generate streams it has not released).
ENGINE_FIGURES = ("running_requests", "queued_requests", "used_kv_blocks", "active_kv_sessions")
SIDECAR_FIGURE = "in_flight"
FRONTEND_INFLIGHT = "lab_frontend_inflight_requests"
FRONTEND_WORKER_INFLIGHT = "lab_frontend_worker_inflight_requests"

#: The run directory's file of every level's leak-check figures (LeakReport.to_dict by level).
LEAKS_JSON = "leaks.json"
TARGET_NOTE = ("leak check: not run against --target (the lab cannot see inside a target's "
               "processes); the level's `cancelled` column is what the client saw")

Figures = dict[str, dict[str, float]]  # process -> figure -> value


class LeakFound(RuntimeError):
    """A level left something held: the sweep stops (its records are kept)."""


@dataclass
class LeakReport:
    level: str
    settled_s: float | None  # how long the stack took to be idle again (None: it never was)
    figures: Figures = field(default_factory=dict)  # each process's figures when the wait ended
    leaks: list[str] = field(default_factory=list)  # "engine-decode-0: used_kv_blocks 64 (idle 0)"
    waited_s: float = 0.0

    def message(self) -> str:
        return (f"{self.level}: leak check failed after {self.waited_s:.1f} s: "
                + "; ".join(self.leaks))

    def to_dict(self) -> dict[str, Any]:
        return {"settled_s": self.settled_s, "waited_s": self.waited_s, "leaks": self.leaks,
                "figures": self.figures}


def engine_load(address: str, timeout_s: float) -> dict[str, float]:
    """One engine's GetLoad as the figures the check compares (blocking: run in a thread)."""
    quiet_grpc_fork()
    import grpc
    from google.protobuf import json_format

    from lab.wire.gen.openengine.v1 import openengine_pb2_grpc, server_pb2

    with grpc.insecure_channel(address) as channel:
        info = openengine_pb2_grpc.ControlStub(channel).GetLoad(
            server_pb2.GetLoadRequest(), timeout=timeout_s)
    out = {name: float(getattr(info, name)) for name in ENGINE_FIGURES if info.HasField(name)}
    if info.HasField("attributes"):
        attrs = json_format.MessageToDict(info.attributes)
        if isinstance(attrs.get(OPEN_STREAMS), int | float):
            out[OPEN_STREAMS] = float(attrs[OPEN_STREAMS])
    return out


def parse_frontend_metrics(text: str) -> dict[str, float]:
    """The frontend's in-flight gauges from its /metrics text: the total, and one figure per
    worker it has streams open to (`streams_to:<worker>`)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(FRONTEND_INFLIGHT + " "):
            out["inflight_requests"] = float(line.split()[-1])
        elif line.startswith(FRONTEND_WORKER_INFLIGHT + "{"):
            worker = line.split('worker="', 1)[1].split('"', 1)[0]
            out[f"streams_to:{worker}"] = float(line.split()[-1])
    return out


class LeakCheck:
    """Reads every process's figures; `check` waits for them to be back at the baseline's."""

    def __init__(self, processes: Callable[[], list[ProcessView]], frontend_url: str,
                 discovery: str, *, settle_s: float = DEFAULT_SETTLE_S,
                 poll_s: float = POLL_S) -> None:
        self.processes = processes
        self.frontend_url = frontend_url.rstrip("/")
        self.discovery = discovery
        self.settle_s = settle_s
        self.poll_s = poll_s
        self.idle: Figures = {}

    async def baseline(self) -> None:
        """The idle figures: read before the first level, on a stack nothing has used yet."""
        self.idle = await self.read(since=0.0)

    async def read(self, since: float) -> Figures:
        """Every process's figures now; a sidecar's only from a heartbeat after `since` (wall
        clock: its record's `updated_at`), else none yet."""
        out: Figures = {}
        engines = [v for v in self.processes() if v.role == "engine" and v.address]
        loads = await asyncio.gather(
            *(asyncio.to_thread(engine_load, v.address, 5.0) for v in engines if v.address),
            return_exceptions=True)
        for view, load in zip(engines, loads, strict=True):
            out[view.name] = ({"unreachable": 1.0} if isinstance(load, BaseException)
                              else load)
        registry = open_registry(self.discovery)
        try:
            for record in await registry.list():
                if record.updated_at >= since and SIDECAR_FIGURE in record.load:
                    out[record.worker_id] = {SIDECAR_FIGURE: float(record.load[SIDECAR_FIGURE])}
        finally:
            await registry.close()
        async with aiohttp.ClientSession() as session:
            try:
                async with session.get(f"{self.frontend_url}/metrics",
                                       timeout=aiohttp.ClientTimeout(total=5.0)) as resp:
                    out["frontend"] = parse_frontend_metrics(await resp.text())
            except (aiohttp.ClientError, TimeoutError):
                out["frontend"] = {"unreachable": 1.0}
        return out

    def _leaks(self, now: Figures) -> list[str]:
        leaks = []
        names = {v.name for v in self.processes() if v.role == "sidecar"}
        for name in sorted(names - now.keys()):
            leaks.append(f"{name}: no heartbeat since the level ended")
        for name, figures in sorted(now.items()):
            idle = self.idle.get(name, {})
            for figure, value in sorted(figures.items()):
                base = idle.get(figure, 0.0)
                if value != base:
                    leaks.append(f"{name}: {figure} {value:g} (idle {base:g})")
        return leaks

    async def check(self, level: str) -> LeakReport:
        """Wait up to `settle_s` for every figure to be back at its idle value."""
        started = time.monotonic()
        since = time.time()
        while True:
            now = await self.read(since)
            leaks = self._leaks(now)
            waited = time.monotonic() - started
            if not leaks:
                return LeakReport(level, waited, now, [], waited)
            if waited >= self.settle_s:
                return LeakReport(level, None, now, leaks, waited)
            await asyncio.sleep(self.poll_s)


def after_level_check(check: LeakCheck, run_dir: Path,
                      say: Callable[[str], None]) -> Callable[[str], Awaitable[None]]:
    """The sweep's hook after each level: check, keep the figures in leaks.json, and stop the
    sweep (LeakFound naming each process and figure) on a leak."""
    reports: dict[str, dict[str, Any]] = {}

    async def after(label: str) -> None:
        report = await check.check(label)
        reports[label] = report.to_dict()
        write_json(Path(run_dir) / LEAKS_JSON, reports)
        if report.leaks:
            raise LeakFound(report.message())
        say(f"{label}: leak check: every process back to idle in {report.waited_s:.2f} s")

    return after


def target_note(say: Callable[[str], None]) -> Callable[[str], Awaitable[None]]:
    """Against --target: no check, and the sweep says why after each level."""
    async def after(label: str) -> None:
        say(f"{label}: {TARGET_NOTE}")

    return after
