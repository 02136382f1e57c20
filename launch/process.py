"""One supervised process: spawn in its own process group, log to a file, signal the group."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from lab.shared.pdeath import through_pdeath
from lab.wire.ready import parse_ready

# States a process goes through. "exited": down and not coming back (policy);
# "backoff": waiting to be restarted; "stopped": ended by teardown.
STATES = ("pending", "starting", "ready", "backoff", "exited", "stopped")

# Environment markers: `lab clean` finds processes of a dead launcher by these.
ENV_RUN_DIR = "LAB_RUN_DIR"
ENV_PROCESS = "LAB_PROCESS_NAME"
ENV_SUPERVISOR_PID = "LAB_SUPERVISOR_PID"
ENV_SUPERVISOR_START = "LAB_SUPERVISOR_START"


@dataclass
class ProcessView:
    """What `lab ps`, the table of `lab up` and Stack.processes() show."""

    name: str
    role: str  # engine | sidecar | frontend
    fleet_role: str | None  # aggregated | prefill | decode (None for the frontend)
    pid: int | None
    address: str | None
    state: str
    restarts: int
    instance_id: str | None = None
    exit_code: int | None = None
    create_time: float | None = None  # psutil create_time, guards against pid reuse
    log: str = ""
    host: str | None = None  # the topology host it runs in (None = the root namespace)
    node: str | None = None  # with --ray: the Ray node id it runs on (None = the launcher's)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: The line the launcher writes into a process's log before each start of it.
START_MARK = "--- launcher: start"


@dataclass(eq=False)  # identity semantics: processes are kept in sets and dicts
class ManagedProcess:
    """One supervised process and what the launcher knows of it across its restarts."""

    name: str
    role: str
    fleet_role: str | None
    policy: str
    argv_fn: Callable[[ManagedProcess], list[str]]
    log_path: Path
    env: dict[str, str]
    popen: subprocess.Popen | None = field(default=None, init=False)
    state: str = field(default="pending", init=False)
    address: str | None = field(default=None, init=False)
    #: engine: its fault-injection service (from the ready line)
    admin_address: str | None = field(default=None, init=False)
    instance_id: str | None = field(default=None, init=False)
    restarts: int = field(default=0, init=False)
    starts: int = field(default=0, init=False)
    exit_code: int | None = field(default=None, init=False)
    exit_seen: bool = field(default=True, init=False)  # no process yet
    restart_requested: bool = field(default=False, init=False)
    started_mono: float = field(default=0.0, init=False)
    create_time: float | None = field(default=None, init=False)
    log_offset: int = field(default=0, init=False)
    #: why it is not ready yet (for the not-ready error)
    detail: str = field(default="not started", init=False)
    partner: ManagedProcess | None = field(default=None, init=False)  # a sidecar's engine
    #: address of the last incarnation that was ready
    last_address: str | None = field(default=None, init=False)
    #: engine: port to ask for at the next start (0 = any)
    reuse_port: int = field(default=0, init=False)
    #: sidecar: the --engine of this incarnation
    engine_address: str | None = field(default=None, init=False)
    #: topology host (network namespace); None = root
    host: str | None = field(default=None, init=False)
    #: the Ray node id of the agent that runs it (launch.ray_agent); None = the launcher's
    node: str | None = field(default=None, init=False)

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Spawn (from the event-loop thread: PDEATHSIG is tied to the spawning thread)."""
        argv = self.argv_fn(self)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            log.write(f"{START_MARK} #{self.starts + 1} at {stamp}: "
                      f"{' '.join(argv)}\n".encode())
            log.flush()
            self.log_offset = log.tell()
            # No preexec_fn: the child sets its own parent-death signal (lab.shared.pdeath).
            self.popen = subprocess.Popen(
                through_pdeath(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env,
                     ENV_PROCESS: self.name},
                close_fds=True,
            )
        self.starts += 1
        self.state = "starting"
        self.address = None
        self.admin_address = None
        self.exit_code = None
        self.exit_seen = False
        self.started_mono = time.monotonic()
        self.detail = "no ready line in its log yet"
        self.create_time = _create_time(self.popen.pid)

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    def poll(self) -> int | None:
        """The exit code once the process has exited (reaps it), else None."""
        if self.popen is None:
            return None
        return self.popen.poll()

    @property
    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal_group(self, sig: int) -> bool:
        """Signal the process group (only while its leader is not reaped: no pgid reuse)."""
        if not self.alive:
            return False
        assert self.popen is not None
        try:
            os.killpg(self.popen.pid, sig)
            return True
        except ProcessLookupError:
            return False

    # -- log ------------------------------------------------------------------------------------

    def ready_fields(self) -> dict[str, str] | None:
        """The ready line logged by the current incarnation, if any."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self.log_offset)
                data = log.read()
        except OSError:
            return None
        for line in data.decode(errors="replace").splitlines():
            fields = parse_ready(line)
            if fields:
                return fields
        return None

    def log_tail(self, lines: int = 30) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(0, os.SEEK_END)
                size = log.tell()
                log.seek(max(0, size - 64 * 1024))
                text = log.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def view(self) -> ProcessView:
        """The view's fields, read from the attributes of the same name (the log as a path)."""
        shown = {f.name: getattr(self, f.name) for f in fields(ProcessView) if f.name != "log"}
        return ProcessView(**shown, log=str(self.log_path))


def _create_time(pid: int) -> float | None:
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:
        return None


def own_create_time() -> float | None:
    """This process's psutil create_time (with the pid, identifies the supervisor)."""
    return _create_time(os.getpid())
