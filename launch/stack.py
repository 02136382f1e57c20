"""Stack: a running topology as an async context manager (the code behind `lab up`, `lab sweep`
and `lab nagle`).

    async with Stack(TopologySpec.disaggregated(prefill=1, decode=1), run_dir) as stack:
        ... load against stack.frontend_url, model stack.model ...
        await stack.fault("engine-decode-0", "kill")

__aenter__ starts everything and waits for readiness (LaunchError naming the process that did
not become ready, with its log tail; everything already started is torn down first).
__aexit__ tears down (SIGTERM, grace, SIGKILL), writes procs.parquet and the final state.json.

With hosts (TopologySpec.hosts), the network namespaces, bridge and links are created before any
process starts (launch.netns.NetworkLab) and removed last: processes, then etcd, then the network.

With `ray_address` (`--ray`), the processes the topology places on Ray nodes (`ray_resource`,
`ray_labels`) run under those nodes' agents (launch.ray_fleet), the rest here; discovery is etcd
(a local one by default, listening on this machine's cluster address too), and every process
binds its node's address so that the others reach it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from launch.commands import Programs
from launch.config import write_config
from launch.control import serve_control
from launch.errors import LaunchError, TopologyError
from launch.events import EventLog
from launch.placement import Placement
from launch.process import ProcessView, own_create_time
from launch.readiness import registry_dir
from launch.registry_watch import RegistryWatch
from launch.sampler import Sampler
from launch.state import write_state
from launch.supervisor import Supervisor
from launch.topology import TopologySpec


class Stack:
    def __init__(
        self,
        spec: TopologySpec,
        run_dir: Path,
        *,
        sample_interval_s: float = 0.5,
        programs: Programs | None = None,
        control: bool = True,
        ray_address: str | None = None,
    ) -> None:
        spec.validate()
        spec.check_ray(ray_address)
        if spec.ray_placement() and spec.discovery is None:
            spec = dataclasses.replace(spec, discovery="etcd")
        self.spec = spec
        self.ray_address = ray_address
        self.run_dir = Path(run_dir)
        self.sample_interval_s = sample_interval_s
        self.programs = programs
        self.control = control
        self.model = spec.model
        self.frontend_url = ""
        self.discovery = spec.discovery or f"file:{self.run_dir.resolve() / 'discovery'}"
        self.events_path = self.run_dir / "events.jsonl"
        self.events: EventLog | None = None
        self.supervisor: Supervisor | None = None
        self.sampler: Sampler | None = None
        self.state = "new"
        self.error: str | None = None
        self._tg: asyncio.TaskGroup | None = None
        self._side_tasks: list[asyncio.Task] = []
        self._closed = False
        self._own_create_time = own_create_time()
        self._registry_watch: RegistryWatch | None = None
        self._registry_task: asyncio.Task | None = None
        self._etcd: Any = None  # launch.etcd.LocalEtcd when discovery == "etcd"
        self._lab: Any = None  # launch.netns.NetworkLab when the topology has hosts
        self.placement = Placement()
        self.ray_fleet: Any = None  # launch.ray_fleet.RayFleet when the topology uses Ray

    # -- public API -----------------------------------------------------------------------------

    def processes(self) -> list[ProcessView]:
        remote = [] if self.ray_fleet is None else self.ray_fleet.views()
        return self._in_spec_order(self._local_views() + remote)

    def _local_views(self) -> list[ProcessView]:
        return [] if self.supervisor is None else [p.view() for p in self.supervisor.processes]

    def _in_spec_order(self, views: list[ProcessView]) -> list[ProcessView]:
        """Engines, sidecars, the frontend, in the topology's order (wherever they run)."""
        order = {name: k for k, name in enumerate(
            [f"{p}-{s}" for p in ("engine", "sidecar") for _, s in self.spec.workers()]
            + ["frontend"])}
        return sorted(views, key=lambda v: order.get(v.name, len(order)))

    async def fault(self, name: str, kind: str) -> str:
        """kill|stop|cont|restart|not-serving|serving|freeze|unfreeze|executor-failure."""
        assert self.supervisor is not None, "the stack is not running"
        if self.ray_fleet is not None and name in self.ray_fleet.names:
            return await self.ray_fleet.fault(name, kind)
        return await self.supervisor.fault(name, kind)

    def cpu_samples(self) -> list[dict[str, Any]]:
        if self.ray_fleet is not None:
            self.ray_fleet.samples_now()  # into the sampler's samples
        return [] if self.sampler is None else self.sampler.samples_now()

    def on_event(self, listener: Callable[[dict[str, Any]], None]) -> None:
        """Call `listener(event)` for every event from now on (e.g. to print restarts)."""
        assert self.events is not None
        self.events.listeners.append(listener)

    # -- context manager ----------------------------------------------------------------------

    async def __aenter__(self) -> Stack:
        (self.run_dir / "logs").mkdir(parents=True, exist_ok=True)
        directory = registry_dir(self.discovery)
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
        self.events = EventLog(self.events_path)
        try:
            if self.spec.hosts:
                await self._start_network()
            if self.spec.ray_placement():
                self._join_ray()
            if self.spec.discovery == "etcd":
                await self._start_etcd()
        except BaseException as exc:
            self.state, self.error = "failed", str(exc)
            if self._etcd is not None:
                with contextlib.suppress(Exception):
                    await self._etcd.stop()
            await self._destroy_network()
            if self.ray_fleet is not None:
                self.ray_fleet.disconnect()
            self._save_state()
            self.events.close()
            raise
        write_config(self.run_dir, self.spec, discovery=self.discovery,
                     hosts_resolved=self.placement.describe())
        remote = self.ray_fleet.names if self.ray_fleet is not None else set()
        self.supervisor = Supervisor(
            self.spec, self.run_dir, self.events, self.discovery,
            programs=self.programs, on_change=self._save_state, placement=self.placement,
            names=self._local_names(remote) if remote else None,
        )
        # this machine's processes; the Ray nodes' agents sample theirs (_remote_samples)
        self.sampler = Sampler(self._local_views, self.run_dir / "procs.parquet",
                               interval_s=self.sample_interval_s)
        self.state = "starting"
        self._save_state()
        self._tg = asyncio.TaskGroup()
        await self._tg.__aenter__()
        try:
            self._side_tasks.append(self._tg.create_task(self._guard("sampler", self.sampler.run)))
            if directory is not None:
                self._registry_watch = RegistryWatch(directory, self.events)
                self.events.listeners.append(self._registry_watch.on_event)
                self.supervisor.before_exit_event.append(self._registry_watch.on_exit)
                self._registry_task = self._tg.create_task(
                    self._guard("registry-watch", self._registry_watch.run))
            await self._start_processes()
        except BaseException as exc:
            self.error = str(exc)
            await self._shutdown(failed=True)
            raise
        front = (self.supervisor.frontend.address if self.supervisor.frontend is not None
                 else self.ray_fleet.frontend_address())
        self.frontend_url = f"http://{front}"
        if self.control:
            self._side_tasks.append(self._tg.create_task(
                self._guard("control", lambda: serve_control(self.run_dir, self._on_control))))
        self.state = "ready"
        self.events.emit("stack-ready", "", os.getpid(), frontend_url=self.frontend_url)
        self._save_state()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._shutdown(failed=False)

    # -- internals ------------------------------------------------------------------------------

    def _join_ray(self) -> None:
        """Connect to the Ray cluster (LaunchError("ray", why)); this machine's processes bind
        its cluster address from now on."""
        from launch.ray_fleet import RayFleet

        assert self.events is not None
        self.ray_fleet = RayFleet(
            self.spec, str(self.ray_address), self.run_dir, self.events,
            sample_interval_s=self.sample_interval_s, on_samples=self._remote_samples,
            on_change=self._save_state)
        self.placement = Placement(node_address=self.ray_fleet.connect())

    def _local_names(self, remote: set[str]) -> set[str]:
        """The processes this machine runs when those named `remote` run on Ray nodes."""
        every = {f"{p}-{s}" for p in ("engine", "sidecar") for _, s in self.spec.workers()}
        return (every | {"frontend"}) - remote

    def _remote_samples(self, rows: list[dict[str, Any]]) -> None:
        if self.sampler is not None:
            self.sampler.samples.extend(rows)

    async def _start_processes(self) -> None:
        """The local processes and the Ray nodes' at once (a frontend waits for workers
        wherever they run); the first LaunchError if any is not ready."""
        assert self.supervisor is not None and self._tg is not None
        if self.ray_fleet is None:
            await self.supervisor.start(self._tg)
            return
        try:
            async with asyncio.TaskGroup() as startup:
                startup.create_task(self.supervisor.start(self._tg))
                startup.create_task(self.ray_fleet.start(self.discovery, self._tg))
        except* LaunchError as group:
            raise group.exceptions[0] from None

    async def _start_network(self) -> None:
        """Create the hosts (namespaces, bridge, shaped links); LaunchError("hosts", why)."""
        from launch.netns import NetnsError, NetworkLab

        try:
            self.spec.check_system()
            lab = NetworkLab(self.spec.link_shapes())
        except TopologyError as exc:
            raise LaunchError("hosts", str(exc)) from None
        loop = asyncio.get_running_loop()
        created = loop.run_in_executor(None, lab.create)
        self._lab = lab
        try:
            # shielded: a Ctrl-C during creation waits for it, then the caller destroys it all
            await asyncio.shield(created)
        except asyncio.CancelledError:
            with contextlib.suppress(BaseException):
                await created
            raise
        except (NetnsError, TopologyError, OSError) as exc:
            raise LaunchError("hosts", str(exc)) from None
        self.placement = Placement.from_lab(lab)
        assert self.events is not None
        self.events.emit("start", "network", os.getpid(), role="network",
                         run_id=lab.run_id, bridge=lab.bridge, gateway=lab.gateway,
                         hosts=self.placement.describe())

    async def _destroy_network(self) -> None:
        """Remove every namespace and link of the run (after its processes are gone)."""
        lab, self._lab = self._lab, None
        if lab is None:
            return
        try:
            await asyncio.shield(asyncio.get_running_loop().run_in_executor(None, lab.destroy))
            if self.events is not None:
                self.events.emit("exit", "network", os.getpid(), 0, role="network")
        except Exception:
            if self.events is not None:
                self.events.emit("error", "network", os.getpid(), detail=traceback.format_exc())

    async def _start_etcd(self) -> None:
        """`--discovery etcd`: a local etcd for this run (stopped after the fleet). With hosts
        it listens on the bridge address too, so that every host reaches it."""
        from launch.etcd import LocalEtcd
        from launch.process import ENV_RUN_DIR, ENV_SUPERVISOR_PID, ENV_SUPERVISOR_START

        hosts: tuple[str, ...] = ("127.0.0.1",)
        reachable = self.placement.gateway or self.placement.node_address
        if reachable is not None and reachable != "127.0.0.1":
            hosts = (reachable, "127.0.0.1")
        self._etcd = LocalEtcd(self.run_dir, hosts=hosts, env={
            ENV_RUN_DIR: str(self.run_dir.resolve()),
            ENV_SUPERVISOR_PID: str(os.getpid()),
            ENV_SUPERVISOR_START: repr(self._own_create_time),
        })
        assert self.events is not None
        self.discovery = await self._etcd.start()
        self.events.emit("start", "etcd", self._etcd.pid, role="etcd", address=self.discovery)

    async def _on_control(self, request: dict[str, Any]) -> str:
        if request.get("op") == "fault":
            return await self.fault(str(request.get("name")), str(request.get("kind")))
        raise ValueError(f"unknown control request {request!r}")

    async def _guard(self, what: str, run: Callable[[], Awaitable[None]]) -> None:
        """A side task must never fail the task group (that would cancel the stack's owner)."""
        try:
            await run()
        except asyncio.CancelledError:
            raise
        except Exception:
            if self.events is not None:
                self.events.emit("error", what, os.getpid(), detail=traceback.format_exc())

    async def _shutdown(self, failed: bool) -> None:
        if self._closed:
            return
        self._closed = True
        self.state = "stopping"
        self._save_state()
        assert self.supervisor is not None and self.events is not None
        if self._registry_task is not None:  # from here on only sidecar exits trigger scans
            self._registry_task.cancel()
            if self._registry_watch is not None:
                with contextlib.suppress(Exception):
                    self._registry_watch.scan()
        try:
            async with asyncio.TaskGroup() as teardown:
                teardown.create_task(self.supervisor.stop())
                if self.ray_fleet is not None:
                    teardown.create_task(self.ray_fleet.stop())
        finally:
            self.supervisor.kill_all_now()
            if self.ray_fleet is not None:
                self.ray_fleet.kill_all_now()
            if self._etcd is not None:
                with contextlib.suppress(Exception):
                    pid = self._etcd.pid
                    code = await self._etcd.stop()
                    self.events.emit("exit", "etcd", pid, code)
            await self._destroy_network()
            for task in self._side_tasks:
                task.cancel()
            if self._tg is not None:
                with contextlib.suppress(BaseException):
                    await self._tg.__aexit__(None, None, None)
            if self.sampler is not None:
                self.sampler.sample_once()
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self.sampler.write)
            self.state = "failed" if failed else "stopped"
            self.events.emit("stack-" + self.state, "", os.getpid())
            self._save_state()
            self.events.close()
            if self.ray_fleet is not None:
                self.ray_fleet.disconnect()

    def _save_state(self) -> None:
        write_state(self.run_dir, {
            "run_dir": str(self.run_dir.resolve()),
            "name": self.spec.name,
            "state": self.state,
            "error": self.error,
            "supervisor_pid": os.getpid(),
            "supervisor_create_time": self._own_create_time,
            "frontend_url": self.frontend_url,
            "model": self.model,
            "discovery": self.discovery,
            "hosts": self.placement.describe(),
            "ray": None if self.ray_fleet is None else {
                "address": self.ray_address, "agents": self.ray_fleet.describe()},
            "grace_s": self.spec.grace_s,
            "updated": time.time(),
            "processes": [v.to_dict() for v in self.processes()],
        })
