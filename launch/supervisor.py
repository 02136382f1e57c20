"""Start a fleet in order, wait for readiness, restart by policy, inject faults, tear down.

Order: every engine and the frontend start at once; each sidecar starts when its engine is
ready (it needs the engine's address); the frontend is ready when /health is 200, i.e. when it
sees every expected worker. All of it within spec.ready_timeout_s, else LaunchError naming the
first process (engines, then sidecars, then the frontend) that is not ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from launch.commands import (
    Programs,
    engine_argv,
    frontend_argv,
    new_instance_id,
    sidecar_argv,
)
from launch.errors import LaunchError
from launch.events import EventLog
from launch.faults import ENGINE_ONLY, FAULT_KINDS, admin_fault
from launch.placement import Placement
from launch.process import (
    ENV_RUN_DIR,
    ENV_SUPERVISOR_PID,
    ENV_SUPERVISOR_START,
    ManagedProcess,
    own_create_time,
)
from launch.readiness import engine_serving, frontend_healthy, sidecar_registered
from launch.topology import TopologySpec

BACKOFF_INITIAL_S = 0.5
BACKOFF_CAP_S = 10.0
STABLE_AFTER_S = 10.0  # a process that ran this long resets its backoff
POLL_S = 0.05
UNKILLABLE_WAIT_S = 10.0


def backoff_delay(consecutive: int) -> float:
    """0.5 s, 1, 2, 4, 8, 10, 10, ... for the 0th, 1st, ... consecutive quick restart."""
    return min(BACKOFF_CAP_S, BACKOFF_INITIAL_S * (2 ** max(0, consecutive)))


class _ExitedEarly(Exception):
    def __init__(self, proc: ManagedProcess, code: int) -> None:
        super().__init__(proc.name)
        self.proc = proc
        self.code = code


class Supervisor:
    def __init__(
        self,
        spec: TopologySpec,
        run_dir: Path,
        events: EventLog,
        discovery: str,
        programs: Programs | None = None,
        on_change: Callable[[], None] | None = None,
        placement: Placement | None = None,
        names: set[str] | None = None,
    ) -> None:
        """`names`: the processes of the topology this supervisor runs (None: all of them);
        an engine and its sidecar go together. A Ray node's agent (launch.ray_agent) runs its
        share of the topology, the launcher the rest."""
        self.spec = spec
        self.names = names
        self.placement = placement or Placement()
        self.run_dir = run_dir
        self.events = events
        self.discovery = discovery
        self.programs = programs or Programs.default()
        self.on_change = on_change or (lambda: None)
        self.stopping = False
        # called with a process whose exit was just reaped, before its exit event is written
        # (the stack records a withdrawal from discovery that preceded the exit)
        self.before_exit_event: list[Callable[[ManagedProcess], None]] = []
        self._started = False
        self._stop_done = 0.0
        self._tg: asyncio.TaskGroup | None = None
        self._restart_tasks: dict[str, asyncio.Task] = {}
        self._consecutive: dict[str, int] = {}
        self.engines: list[ManagedProcess] = []
        self.sidecars: list[ManagedProcess] = []
        self.frontend: ManagedProcess | None = None
        self._build()

    # -- the plan ---------------------------------------------------------------------------

    def _build(self) -> None:
        logs = self.run_dir / "logs"
        env = {
            ENV_RUN_DIR: str(self.run_dir.resolve()),
            ENV_SUPERVISOR_PID: str(os.getpid()),
            ENV_SUPERVISOR_START: repr(own_create_time()),
        }
        spec = self.spec
        place = self.placement
        for fleet, suffix in spec.workers():
            engine_name, sidecar_name = f"engine-{suffix}", f"sidecar-{suffix}"
            if self.names is not None and engine_name not in self.names:
                continue

            def make_engine_argv(proc: ManagedProcess, fleet=fleet) -> list[str]:
                proc.instance_id = new_instance_id(proc.name)
                return place.prefix(fleet.host) + engine_argv(
                    self.programs, spec, fleet, proc.instance_id, port=proc.reuse_port,
                    host=place.bind_address(fleet.host))

            def make_sidecar_argv(proc: ManagedProcess, fleet=fleet) -> list[str]:
                assert proc.partner is not None and proc.partner.last_address is not None
                proc.engine_address = proc.partner.last_address
                return place.prefix(fleet.host) + sidecar_argv(
                    self.programs, spec, fleet, proc.engine_address, self.discovery,
                    proc.name, host=place.bind_address(fleet.host, reachable_from_hosts=True))

            engine = ManagedProcess(engine_name, "engine", fleet.role, fleet.restart_engine,
                                    make_engine_argv, logs / f"{engine_name}.log", env)
            sidecar = ManagedProcess(sidecar_name, "sidecar", fleet.role,
                                     fleet.restart_sidecar, make_sidecar_argv,
                                     logs / f"{sidecar_name}.log", env)
            sidecar.partner = engine
            engine.host = sidecar.host = fleet.host
            self.engines.append(engine)
            self.sidecars.append(sidecar)
        if self.names is not None and "frontend" not in self.names:
            return
        self.frontend = ManagedProcess(
            "frontend", "frontend", None, "never",
            lambda proc: place.prefix(spec.frontend_host) + frontend_argv(
                self.programs, spec, self.discovery, host=place.bind_address(spec.frontend_host)),
            logs / "frontend.log", env,
        )
        self.frontend.host = spec.frontend_host

    @property
    def processes(self) -> list[ManagedProcess]:
        return [*self.engines, *self.sidecars, *self.fronts]

    @property
    def fronts(self) -> list[ManagedProcess]:
        """The frontend, when this supervisor runs it."""
        return [] if self.frontend is None else [self.frontend]

    def get(self, name: str) -> ManagedProcess:
        for proc in self.processes:
            if proc.name == name:
                return proc
        known = ", ".join(p.name for p in self.processes)
        raise KeyError(f"no process named {name!r} (processes: {known})")

    # -- start ----------------------------------------------------------------------------------

    async def start(self, tg: asyncio.TaskGroup) -> None:
        """Start everything and wait until it is ready; LaunchError otherwise."""
        self._tg = tg
        tg.create_task(self._monitor(), name="supervisor-monitor")
        timeout = self.spec.ready_timeout_s
        try:
            async with asyncio.timeout(timeout):
                async with asyncio.TaskGroup() as startup:
                    for engine, sidecar in zip(self.engines, self.sidecars, strict=True):
                        self._spawn(engine)
                        startup.create_task(self._bring_up(engine, sidecar))
                    for front in self.fronts:
                        self._spawn(front)
                        startup.create_task(self._wait_ready(front))
        except* _ExitedEarly as group:
            exited = [e for e in group.exceptions if isinstance(e, _ExitedEarly)]
            first = min(exited, key=lambda e: self._rank(e.proc))
            proc = first.proc
            raise LaunchError(
                proc.name, f"exited with code {first.code} before it was ready",
                proc.log_tail(), proc.log_path,
            ) from None
        except* LaunchError as group:
            raise group.exceptions[0] from None
        except* TimeoutError:
            proc = next(p for p in self.processes if p.state != "ready")
            raise LaunchError(
                proc.name, f"not ready within {timeout:g} s ({proc.detail})",
                proc.log_tail(), proc.log_path,
            ) from None
        for proc in self.processes:  # ready once, then gone before the rest was ready
            if proc.poll() is not None:
                raise LaunchError(proc.name, f"exited with code {proc.poll()} during start-up",
                                  proc.log_tail(), proc.log_path)
        self._started = True

    def _rank(self, proc: ManagedProcess) -> int:
        return self.processes.index(proc)

    async def _bring_up(self, engine: ManagedProcess, sidecar: ManagedProcess) -> None:
        await self._wait_ready(engine)
        self._spawn(sidecar)
        await self._wait_ready(sidecar)

    def _spawn(self, proc: ManagedProcess) -> None:
        try:
            proc.start()
        except OSError as exc:  # e.g. the program is missing
            raise LaunchError(proc.name, f"cannot start: {exc}", "", proc.log_path) from exc
        self.events.emit("start", proc.name, proc.pid, role=proc.role,
                         instance_id=proc.instance_id)
        self.on_change()

    async def _wait_ready(self, proc: ManagedProcess) -> None:
        """Until the current incarnation is ready; raises _ExitedEarly if it exits first."""
        pid = proc.pid
        while True:
            code = proc.poll()
            if code is not None:
                raise _ExitedEarly(proc, code)
            if proc.address is None:
                fields = proc.ready_fields()
                if fields is not None:
                    proc.address = fields["listen"]
                    proc.admin_address = fields.get("admin")
                    proc.detail = f"ready line seen ({proc.address}), checking readiness"
            if proc.address is not None:
                ok, detail = await self._probe(proc)
                proc.detail = detail
                if ok and proc.pid == pid and proc.poll() is None:
                    proc.state = "ready"
                    proc.last_address = proc.address
                    self.events.emit("ready", proc.name, proc.pid, address=proc.address,
                                     instance_id=proc.instance_id)
                    self._resync_sidecar(proc)
                    self.on_change()
                    return
            await asyncio.sleep(POLL_S if proc.address is None else 0.1)

    async def _probe(self, proc: ManagedProcess) -> tuple[bool, str]:
        assert proc.address is not None
        if proc.role == "engine":
            return await engine_serving(proc.address)
        if proc.role == "sidecar":
            return await sidecar_registered(self.discovery, proc.name, proc.pid)
        return await frontend_healthy(proc.address)

    # -- supervision ----------------------------------------------------------------------------

    async def _monitor(self) -> None:
        """Reap exits, record them, and schedule restarts by policy."""
        while True:
            # Decide before reaping: `alive` reaps too, so an exit seen only by this check would
            # otherwise never become an event.
            all_exited = self.stopping and not any(p.alive for p in self.processes)
            try:
                self._reap()
            except Exception:  # a bug here must not cancel the stack's owner (task group)
                self.events.emit("error", "supervisor", os.getpid(),
                                 detail=traceback.format_exc())
            if all_exited:
                return
            if self._stop_done and time.monotonic() - self._stop_done > UNKILLABLE_WAIT_S:
                return  # something survived SIGKILL (uninterruptible sleep): do not hang
            await asyncio.sleep(POLL_S)

    def _reap(self) -> None:
        for proc in self.processes:
            if proc.exit_seen or proc.popen is None:
                continue
            code = proc.poll()
            if code is None:
                continue
            proc.exit_seen = True
            proc.exit_code = code
            for hook in self.before_exit_event:
                hook(proc)
            self.events.emit("exit", proc.name, proc.pid, code)
            self._after_exit(proc, code)
            self.on_change()

    def _after_exit(self, proc: ManagedProcess, code: int) -> None:
        if self.stopping:
            proc.state = "stopped"
            return
        requested, proc.restart_requested = proc.restart_requested, False
        restart = (
            requested
            or proc.policy == "always"
            or (proc.policy == "on-failure" and code != 0)
        )
        if not (restart and self._started):
            proc.state = "exited"
            return
        ran = time.monotonic() - proc.started_mono
        if requested or ran >= STABLE_AFTER_S:
            self._consecutive[proc.name] = 0
        attempt = self._consecutive.get(proc.name, 0)
        self._consecutive[proc.name] = attempt + 1
        self._schedule_restart(proc, backoff_delay(attempt), requested)

    def _schedule_restart(self, proc: ManagedProcess, delay: float, requested: bool) -> None:
        if proc.role == "engine":
            # ask for the same port again (its sidecar's --engine stays valid), unless that
            # failed last time (e.g. the port was taken meanwhile)
            failed_on_port = proc.reuse_port and proc.state != "ready"
            proc.reuse_port = 0 if failed_on_port or not proc.last_address else int(
                proc.last_address.rpartition(":")[2])
        proc.state = "backoff"
        assert self._tg is not None
        self._restart_tasks[proc.name] = self._tg.create_task(
            self._restart(proc, delay, requested), name=f"restart-{proc.name}"
        )

    async def _restart(self, proc: ManagedProcess, delay: float, requested: bool) -> None:
        try:
            await asyncio.sleep(delay)
            if proc.role == "sidecar" and proc.partner is not None:
                await self._wait_engine(proc.partner)
            if self.stopping:
                return
            proc.restarts += 1
            self.events.emit("restart", proc.name, proc.pid, proc.exit_code,
                             attempt=proc.restarts, delay_s=delay, requested=requested)
            self._spawn(proc)
            try:
                async with asyncio.timeout(self.spec.ready_timeout_s):
                    await self._wait_ready(proc)
            except TimeoutError:
                self.events.emit("not-ready", proc.name, proc.pid, detail=proc.detail)
            except _ExitedEarly:
                pass  # the monitor records the exit and applies the policy again
        except Exception:  # never fail the task group (it would cancel the stack's owner)
            self.events.emit("error", proc.name, proc.pid, detail=traceback.format_exc())
            proc.state = "exited"
        finally:
            self._restart_tasks.pop(proc.name, None)

    async def _wait_engine(self, engine: ManagedProcess) -> None:
        """A sidecar restarts once its engine is ready (or will not come back)."""
        deadline = time.monotonic() + self.spec.ready_timeout_s
        while not self.stopping and time.monotonic() < deadline:
            if engine.state == "exited" or (engine.state == "ready" and engine.alive):
                return
            await asyncio.sleep(0.1)

    def _resync_sidecar(self, engine: ManagedProcess) -> None:
        """An engine came back on another address: a sidecar still started with the old one
        (waiting for an engine that will never answer there) is restarted with the new one."""
        if engine.role != "engine" or not self._started:
            return
        sidecar = next((s for s in self.sidecars if s.partner is engine), None)
        if sidecar is None or not sidecar.alive or sidecar.engine_address == engine.address:
            return
        self.events.emit("resync", sidecar.name, sidecar.pid, engine_address=engine.address)
        sidecar.restart_requested = True
        sidecar.signal_group(signal.SIGTERM)

    # -- faults -----------------------------------------------------------------------------

    async def fault(self, name: str, kind: str) -> str:
        """Inject a fault; returns a short description. ValueError/KeyError/RuntimeError."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r} (kinds: {', '.join(FAULT_KINDS)})")
        proc = self.get(name)
        if kind in ENGINE_ONLY and proc.role != "engine":
            raise ValueError(f"fault {kind!r} applies to engines, not to {name} ({proc.role})")
        if kind == "restart" and proc.state == "exited" and self._started and not self.stopping:
            # A process that exited under its policy (`--restart-engine never` after a kill)
            # comes back when asked: that is what a user means by restarting it.
            self.events.emit("fault", proc.name, proc.pid, kind=kind)
            self._schedule_restart(proc, 0.0, requested=True)
            return f"{kind} -> {name}: starting it again (it had exited)"
        if not proc.alive:
            raise RuntimeError(f"{name} is not running (state {proc.state})")
        self.events.emit("fault", proc.name, proc.pid, kind=kind)
        if kind == "kill":
            proc.signal_group(signal.SIGKILL)
        elif kind == "stop":
            proc.signal_group(signal.SIGSTOP)
        elif kind == "cont":
            proc.signal_group(signal.SIGCONT)
        elif kind == "restart":
            proc.restart_requested = True
            proc.signal_group(signal.SIGTERM)
            proc.signal_group(signal.SIGCONT)
        else:
            if proc.admin_address is None:
                raise RuntimeError(f"{name} serves no admin service (its ready line names no "
                                   f"admin= address), so it cannot take a {kind} fault")
            reply = await admin_fault(proc.admin_address, kind)
            return f"{kind} -> {name}: {reply}".rstrip(": ")
        return f"{kind} -> {name} (pid {proc.pid})"

    # -- teardown -----------------------------------------------------------------------------

    async def stop(self) -> None:
        """SIGTERM (frontend and sidecars first, then engines), wait grace, SIGKILL the rest.

        Once the frontend has exited, the sidecars still up get a second SIGTERM, which ends
        their serving grace at once (`lab sidecar`): the grace keeps a withdrawn worker
        serving for frontends that have not seen the withdrawal, and this stack's only one is
        gone. Without it a stack that never served a request took the whole grace (5 s) to
        stop. Where this supervisor does not run the frontend (Ray), the sidecars keep it."""
        self.stopping = True
        for task in list(self._restart_tasks.values()):
            task.cancel()
        await self._terminate([*self.fronts, *self.sidecars], hurry_sidecars=bool(self.fronts))
        await self._terminate(self.engines)
        for proc in self.processes:
            if proc.state != "exited":
                proc.state = "stopped"
        self._stop_done = time.monotonic()
        self.on_change()

    async def _terminate(self, group: list[ManagedProcess], *,
                         hurry_sidecars: bool = False) -> None:
        """SIGTERM `group`, wait up to the grace, SIGKILL what is left. `hurry_sidecars`: once
        the frontend has exited, a second SIGTERM to the sidecars still up."""
        live = [p for p in group if p.alive]
        for proc in live:
            proc.signal_group(signal.SIGTERM)
            proc.signal_group(signal.SIGCONT)  # a stopped process must run to see SIGTERM
        deadline = time.monotonic() + self.spec.grace_s
        while any(p.alive for p in live) and time.monotonic() < deadline:
            if hurry_sidecars and not any(p.alive for p in self.fronts):
                for proc in self.sidecars:
                    if proc.alive:
                        proc.signal_group(signal.SIGTERM)
                hurry_sidecars = False
            await asyncio.sleep(POLL_S)
        for proc in live:
            if proc.signal_group(signal.SIGKILL):
                self.events.emit("kill", proc.name, proc.pid, reason="grace period over")
        for proc in live:
            if proc.popen is not None:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(proc.popen.wait, 5)

    def kill_all_now(self) -> None:
        """Last resort (synchronous): SIGKILL every live process group."""
        self.stopping = True
        for proc in self.processes:
            proc.signal_group(signal.SIGKILL)
