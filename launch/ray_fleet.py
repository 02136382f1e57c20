"""The processes a topology places on Ray nodes (`lab up --ray`, `lab sweep --ray`; docs/ray.md).

The places of the topology (a fleet's `ray_resource` and `ray_labels`, or the frontend's
`frontend_ray_resource` and `frontend_ray_labels`: a `launch.topology.RayPlace`) are resolved to
the live nodes that satisfy them when the driver connects (`launch.ray_nodes.assign`: a fleet's
engines round-robin over its nodes; a place no node satisfies is an error before anything
starts). Each node that runs something gets ONE agent, a `launch.ray_agent.NodeAgent` actor
pinned to it (NodeAffinitySchedulingStrategy, soft=False; no CPU) with all of that node's
processes, which bind and advertise the node's address. The agent supervises them as its
children; when it dies its processes die with it. This module is the driver's side:

- `connect`: join the cluster and resolve the places to nodes (LaunchError naming the fleet).
- `start`: create the agents, measure each one's clock offset (NTP-style, min RTT), start them
  all at once and wait for their processes' readiness (a LaunchError names the first that is
  not ready, with its log tail, as locally).
- a poll task (every POLL_S): each agent's process views (for state.json and `lab ps`), its
  events (written into the run's events.jsonl, stamps moved onto the driver's clock, with the
  agent's node) and its CPU/RSS samples (into the run's procs.parquet, likewise shifted).
- `fault`: the agent's supervisor performs it, as `Stack.fault` does locally.
- `stop`: each agent tears its processes down (SIGTERM, grace, SIGKILL); then the actors are
  killed.

Ray is imported only when a topology places something on Ray.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.shared.ray_connect import ClockOffset, RayConnectError, connect, measure_offset
from launch.errors import LaunchError
from launch.events import EventLog
from launch.process import ProcessView
from launch.ray_nodes import NoNodeError, RayNode, assign, by_node, live_nodes
from launch.topology import TopologySpec

#: Seconds between two polls of the agents.
POLL_S = 0.5
#: Clock pings per agent at start (the one with the smallest round trip gives the offset).
CLOCK_PINGS = 8
#: Stamped fields of an event or sample that are the node's perf_counter_ns().
_STAMPS = ("t_ns",)


@dataclass
class _Agent:
    node: RayNode
    names: list[str]
    actor: Any = None
    where: dict[str, Any] = field(default_factory=dict)
    clock: ClockOffset | None = None
    views: list[ProcessView] = field(default_factory=list)
    lost: str | None = None

    @property
    def name(self) -> str:
        """`ray-` and the node id's first 12 hex digits (as `lab ps` shows the node)."""
        return f"ray-{self.node.node_id[:12]}"

    def options(self) -> dict[str, Any]:
        """The actor's options: pinned to its node (not soft: nowhere else), no CPU."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return {"num_cpus": 0, "max_concurrency": 64,
                "scheduling_strategy": NodeAffinitySchedulingStrategy(self.node.node_id,
                                                                      soft=False)}

    async def ping(self) -> int:
        return int(await self.actor.clock.remote())

    def shift(self, row: dict[str, Any]) -> dict[str, Any]:
        """A row stamped on the agent's clock, moved onto the driver's."""
        offset = self.clock.offset_ns if self.clock is not None else 0
        return {**row, **{k: row[k] - offset for k in _STAMPS if isinstance(row.get(k), int)}}


class RayFleet:
    """The Ray-placed part of a running topology (see the module docstring)."""

    def __init__(self, spec: TopologySpec, address: str, run_dir: Path, events: EventLog,
                 *, sample_interval_s: float, on_samples: Callable[[list[dict]], None],
                 on_change: Callable[[], None]) -> None:
        self.spec = spec
        self.address = address
        self.run_dir = run_dir
        self.events = events
        self.sample_interval_s = sample_interval_s
        self.on_samples = on_samples
        self.on_change = on_change
        self._placed = set(spec.ray_placement())
        self.agents: list[_Agent] = []  # one per node, once connected
        self._connected = False
        self._poller: asyncio.Task | None = None

    @property
    def names(self) -> set[str]:
        return set(self._placed)

    # -- connecting -----------------------------------------------------------------------------

    def connect(self) -> str:
        """Join the cluster and resolve the places to its live nodes (blocking); this machine's
        address on it. LaunchError("ray", why), or naming the fleet no node can take."""
        try:
            self._connected = connect(self.address)
        except RayConnectError as exc:
            raise LaunchError("ray", str(exc)) from None
        import ray

        try:
            assigned = assign(self.spec, live_nodes())
        except NoNodeError as exc:
            raise LaunchError(exc.who, str(exc)) from None
        self.agents = [_Agent(node, names) for node, names in by_node(assigned).items()]
        return str(ray.util.get_node_ip_address())

    # -- start ----------------------------------------------------------------------------------

    async def start(self, discovery: str, tg: asyncio.TaskGroup) -> None:
        import ray

        from launch.ray_agent import NodeAgent

        remote_cls = ray.remote(NodeAgent)
        spec = self.spec.to_dict()
        for agent in self.agents:
            agent.actor = remote_cls.options(**agent.options()).remote(
                spec, str(self.run_dir.resolve()), discovery, agent.names, agent.name,
                self.sample_interval_s, agent.node.address)
        timeout = self.spec.ready_timeout_s
        for agent in self.agents:
            try:
                agent.where = await asyncio.wait_for(agent.actor.where.remote(), timeout)
            except TimeoutError:
                raise LaunchError(agent.name, f"Ray node {agent.node.describe()} did not start "
                                  f"its agent within {timeout:g} s") from None
            except ray.exceptions.RayError as exc:
                raise LaunchError(agent.name, f"its agent did not start: {exc}") from None
            agent.clock = await measure_offset(agent.ping, CLOCK_PINGS)
            self.events.emit("start", agent.name, agent.where.get("pid"), role="ray-agent",
                             node=agent.where.get("node_id"), address=agent.where.get("address"),
                             processes=agent.names,
                             clock_offset_ns=agent.clock.offset_ns,
                             clock_error_ns=agent.clock.error_ns)
        results = await asyncio.gather(*(a.actor.start.remote() for a in self.agents))
        for agent, result in zip(self.agents, results, strict=True):
            self._apply(agent, {"views": result.get("views", []), "events": [], "samples": []})
        self._collect(await self._poll_all())
        for result in results:
            if "error" in result:
                e = result["error"]
                raise LaunchError(e["name"], e["reason"], e.get("log_tail", ""),
                                  Path(e["log_path"]) if e.get("log_path") else None)
        self._poller = tg.create_task(self._poll_loop(), name="ray-fleet-poll")

    # -- the running fleet ----------------------------------------------------------------------

    def views(self) -> list[ProcessView]:
        return [v for a in self.agents for v in a.views]

    def frontend_address(self) -> str | None:
        return next((v.address for v in self.views() if v.role == "frontend"), None)

    def describe(self) -> list[dict[str, Any]]:
        """For state.json: each agent's node (id, address), pid, processes and clock."""
        return [{"agent": a.name, "node_id": a.node.node_id, "address": a.node.address,
                 "processes": a.names, **a.where,
                 "clock_offset_ns": a.clock.offset_ns if a.clock else None,
                 "clock_error_ns": a.clock.error_ns if a.clock else None, "lost": a.lost}
                for a in self.agents]

    async def fault(self, name: str, kind: str) -> str:
        agent = next(a for a in self.agents if name in a.names)
        if agent.lost is not None:
            raise RuntimeError(f"{name} is not running: {agent.lost}")
        reply = await agent.actor.fault.remote(name, kind)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        self._collect(await self._poll_all())
        return str(reply["message"])

    def samples_now(self) -> None:
        """A sample of every agent's processes taken now, with those not collected yet, into
        the run's samples (blocking, briefly: a sweep asks for them when a level ends)."""
        import ray

        live = [a for a in self.agents if a.lost is None and a.actor is not None]
        refs = [a.actor.poll.remote(True) for a in live]
        for agent, ref in zip(live, refs, strict=True):
            try:
                self._apply(agent, ray.get(ref, timeout=POLL_S * 10))
            except Exception as exc:
                self._lose(agent, exc)

    async def _poll_loop(self) -> None:
        """Until cancelled; a failure here is an error event, never the stack's end."""
        while True:
            await asyncio.sleep(POLL_S)
            try:
                self._collect(await self._poll_all())
            except Exception:
                self.events.emit("error", "ray-fleet", os.getpid(),
                                 detail=traceback.format_exc())

    async def _poll_all(self, sample_now: bool = False) -> list[tuple[_Agent, Any]]:
        live = [a for a in self.agents if a.lost is None and a.actor is not None]

        async def one(agent: _Agent) -> Any:
            try:
                return await agent.actor.poll.remote(sample_now)
            except Exception as exc:  # its actor or node is gone
                return exc

        return list(zip(live, await asyncio.gather(*(one(a) for a in live)), strict=True))

    def _collect(self, replies: list[tuple[_Agent, Any]]) -> None:
        for agent, reply in replies:
            if isinstance(reply, Exception):
                self._lose(agent, reply)
            else:
                self._apply(agent, reply)

    def _apply(self, agent: _Agent, reply: dict[str, Any]) -> None:
        before = [v.to_dict() for v in agent.views]
        agent.views = [ProcessView(**v) for v in reply["views"]]
        for event in reply["events"]:
            self.events.record({**agent.shift(event), "node": agent.where.get("node_id")})
        if reply["samples"]:
            self.on_samples([agent.shift(s) for s in reply["samples"]])
        if reply["events"] or before != [v.to_dict() for v in agent.views]:
            self.on_change()

    def _lose(self, agent: _Agent, exc: BaseException) -> None:
        if agent.lost is not None:
            return
        agent.lost = f"{agent.name} on node {agent.where.get('node_id')} lost: " \
                     f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        for view in agent.views:
            if view.state not in ("exited", "stopped"):
                view.state = "exited"
        self.events.emit("exit", agent.name, agent.where.get("pid"), role="ray-agent",
                         node=agent.where.get("node_id"), reason=agent.lost)
        self.on_change()

    # -- teardown -------------------------------------------------------------------------------

    async def stop(self) -> None:
        """Every agent tears its processes down (at once), then its actor is killed."""
        if self._poller is not None:
            self._poller.cancel()
        # an agent no node took has nothing to stop (kill_all_now removes it)
        live = [a for a in self.agents if a.lost is None and a.actor is not None and a.where]

        async def one(agent: _Agent) -> None:
            try:
                reply = await asyncio.wait_for(agent.actor.stop.remote(),
                                               self.spec.grace_s * 2 + 15)
            except Exception as exc:
                self._lose(agent, exc)
            else:
                self._apply(agent, reply)

        await asyncio.gather(*(one(a) for a in live))
        self.kill_all_now()

    def kill_all_now(self) -> None:
        """Kill the agents' actors: their processes die with them (lab.shared.pdeath)."""
        if not self.agents or (not self._connected and not self._ray_initialized()):
            return
        import ray

        for agent in self.agents:
            if agent.actor is not None:
                with contextlib.suppress(Exception):
                    ray.kill(agent.actor)
                self.events.emit("exit", agent.name, agent.where.get("pid"), role="ray-agent",
                                 node=agent.where.get("node_id"))
                agent.actor = None

    def disconnect(self) -> None:
        if self._connected:
            import ray

            ray.shutdown()
            self._connected = False

    @staticmethod
    def _ray_initialized() -> bool:
        try:
            import ray
        except ImportError:
            return False
        return bool(ray.is_initialized())

