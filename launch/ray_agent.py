"""A Ray node's agent: the actor that runs that node's share of the topology (`--ray`).

The agent is a Ray async actor (`launch.ray_fleet` creates one per node that runs something,
pinned to it, with all of that node's processes; `launch.ray_nodes` says which). Inside it runs
the launcher's own `Supervisor` on the processes placed there, and a `Sampler` on them: the
same spawn (own process group, log file, `lab.shared.pdeath`), ready lines, readiness probes,
restart policies, backoff and faults as a local run. The processes are the actor's children: its
event-loop thread spawns them, so when the actor's process dies (ray.kill, its node lost, its
driver gone) the kernel signals them.

The driver talks to it through four calls: `start` (spawn and wait for readiness), `poll` (the
processes' views, the events and CPU/RSS samples since the last poll), `fault` and `stop`. Each
answers plain dicts, never raises: an error is {"error": ...}, so nothing depends on pickling
the launcher's exceptions across Ray.

The module does not import Ray at its top: `launch.ray_fleet` wraps the class with
`ray.remote` when --ray is given.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import traceback
from pathlib import Path
from typing import Any

from launch.errors import LaunchError
from launch.events import EventLog
from launch.placement import Placement
from launch.sampler import Sampler
from launch.supervisor import Supervisor
from launch.topology import TopologySpec

#: Where an agent keeps its own events and samples in the run directory (per agent).
NODES_DIR = "nodes"


class NodeAgent:
    """One Ray node's processes of a run (a Ray async actor; see the module docstring)."""

    def __init__(self, spec: dict[str, Any], run_dir: str, discovery: str, names: list[str],
                 agent: str, sample_interval_s: float, address: str) -> None:
        self.spec = TopologySpec.from_dict(spec)
        self.run_dir = Path(run_dir)
        self.discovery = discovery
        self.names = set(names)
        self.agent = agent
        self.sample_interval_s = sample_interval_s
        #: the node's address (its NodeManagerAddress): every process here binds and
        #: advertises it, so the other nodes reach them
        self.address = address
        self.supervisor: Supervisor | None = None
        self.sampler: Sampler | None = None
        self._events: list[dict[str, Any]] = []
        self._samples_sent = 0
        self._stop = asyncio.Event()
        self._life: asyncio.Task | None = None

    def clock(self) -> int:
        return time.perf_counter_ns()

    def where(self) -> dict[str, Any]:
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(),
                "address": self.address, "ray_node_ip": ray.util.get_node_ip_address(),
                "host": socket.gethostname(),
                "pid": os.getpid(), "agent": self.agent}

    async def start(self) -> dict[str, Any]:
        """Spawn this node's processes and wait until they are ready (within the topology's
        ready_timeout_s); {"error": {name, reason, log_tail, log_path}} when one is not."""
        where = self.where()
        own = self.run_dir / NODES_DIR / self.agent
        events = EventLog(own / "events.jsonl")
        events.listeners.append(self._events.append)
        self.supervisor = Supervisor(
            self.spec, self.run_dir, events, self.discovery,
            placement=Placement(node_address=where["address"]), names=self.names)
        for proc in self.supervisor.processes:
            proc.node = where["node_id"]
        self.sampler = Sampler(self.views, own / "procs.parquet",
                               interval_s=self.sample_interval_s)
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._life = asyncio.create_task(self._run(events, ready), name=f"agent-{self.agent}")
        try:
            await ready
        except LaunchError as exc:
            return {"error": {"name": exc.name, "reason": exc.reason, "log_tail": exc.log_tail,
                              "log_path": str(exc.log_path or "")}}
        except Exception as exc:
            return {"error": {"name": self.agent, "reason": f"agent failed: {exc!r}",
                              "log_tail": traceback.format_exc(), "log_path": ""}}
        return {"where": where, "views": self.views_dicts()}

    async def _run(self, events: EventLog, ready: asyncio.Future[None]) -> None:
        """The agent's life: the supervisor's tasks in one task group, until stop()."""
        assert self.supervisor is not None and self.sampler is not None
        supervisor, sampler = self.supervisor, self.sampler
        try:
            async with asyncio.TaskGroup() as tg:
                sampling = tg.create_task(self._guard(events, sampler.run))
                try:
                    await supervisor.start(tg)
                except Exception as exc:
                    ready.set_exception(exc)
                else:
                    ready.set_result(None)
                    await self._stop.wait()
                try:
                    await supervisor.stop()
                finally:
                    sampling.cancel()
        finally:
            supervisor.kill_all_now()
            sampler.sample_once()
            with contextlib.suppress(Exception):
                await asyncio.to_thread(sampler.write)
            events.close()
            if not ready.done():
                ready.set_exception(RuntimeError("the agent stopped during start-up"))

    @staticmethod
    async def _guard(events: EventLog, run: Any) -> None:
        try:
            await run()
        except asyncio.CancelledError:
            raise
        except Exception:
            events.emit("error", "sampler", os.getpid(), detail=traceback.format_exc())

    def views(self) -> list[Any]:
        return [] if self.supervisor is None else [p.view() for p in self.supervisor.processes]

    def views_dicts(self) -> list[dict[str, Any]]:
        return [v.to_dict() for v in self.views()]

    def poll(self, sample_now: bool = False) -> dict[str, Any]:
        """The processes' views, and the events and samples since the last poll."""
        events, self._events[:] = list(self._events), []
        samples: list[dict[str, Any]] = []
        if self.sampler is not None:
            if sample_now:
                self.sampler.sample_once()
            samples = self.sampler.samples[self._samples_sent:]
            self._samples_sent += len(samples)
        return {"views": self.views_dicts(), "events": events, "samples": samples}

    async def fault(self, name: str, kind: str) -> dict[str, Any]:
        """The supervisor's fault (launch.supervisor.Supervisor.fault) on a process here."""
        if self.supervisor is None:
            return {"error": f"{self.agent} has not started"}
        try:
            return {"message": await self.supervisor.fault(name, kind)}
        except (ValueError, KeyError, RuntimeError) as exc:
            return {"error": str(exc.args[0]) if isinstance(exc, KeyError) else str(exc)}

    async def stop(self) -> dict[str, Any]:
        """Tear down (SIGTERM, grace, SIGKILL, as locally); the final views."""
        self._stop.set()
        if self._life is not None:
            with contextlib.suppress(BaseException):
                await self._life
        return self.poll()
