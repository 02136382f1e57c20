"""A local etcd for one run: `lab up --discovery etcd` without an address.

    async with LocalEtcd(run_dir) as etcd:
        spec = etcd.spec            # "etcd://127.0.0.1:PORT" -> --discovery for every process
        ...

The data dir lives inside the run directory (`<run_dir>/etcd/data`), the log is
`<run_dir>/logs/etcd.log`, the client and peer ports are picked by the OS and held for etcd's
life (`launch/port_hold.py`: etcd listens beside the hold, and a restart finds them free), and
etcd listens on loopback only (plus, when the run places processes in network namespaces, the
root namespace's bridge address, so that workers inside the hosts reach it: pass
`hosts=[bridge_address, "127.0.0.1"]`; the spec then names the first host). Readiness is a
`/v3/kv/range` call that succeeds (which also proves the v3 gateway is serving). Stopping is
SIGTERM, then SIGKILL after `stop_grace_s`.

The etcd binary comes from Debian's `etcd-server` package (`apt-get install -y etcd-server`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import time
from pathlib import Path

import aiohttp

from launch.errors import LaunchError
from launch.port_hold import PortHold

ETCD_BINARY = "etcd"
INSTALL_HINT = "install it with `apt-get install -y etcd-server` (Debian's package)"
DEFAULT_READY_TIMEOUT_S = 20.0
DEFAULT_STOP_GRACE_S = 5.0
#: Tries at one client port free on every host (the first host's pick may be taken on another).
_PORT_ATTEMPTS = 3


def etcd_binary() -> str | None:
    """The etcd executable on PATH (or $LAB_ETCD_BINARY), or None."""
    override = os.environ.get("LAB_ETCD_BINARY")
    if override:
        return override if os.access(override, os.X_OK) else None
    return shutil.which(ETCD_BINARY)


def etcd_available() -> tuple[bool, str]:
    """(True, path) or (False, reason naming what is missing and how to install it)."""
    path = etcd_binary()
    if path is None:
        return False, f"no `{ETCD_BINARY}` binary on PATH: {INSTALL_HINT}"
    return True, path


class LocalEtcd:
    """One etcd server process for a run; see the module docstring."""

    def __init__(
        self,
        run_dir: Path | str,
        *,
        hosts: tuple[str, ...] | list[str] = ("127.0.0.1",),
        name: str = "etcd",
        ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
        stop_grace_s: float = DEFAULT_STOP_GRACE_S,
        env: dict[str, str] | None = None,
    ) -> None:
        """`env`: extra environment for the etcd process (e.g. the launcher's supervisor
        markers, so that `lab clean` finds an etcd whose launcher died)."""
        if not hosts:
            raise ValueError("LocalEtcd: hosts must name at least one address")
        self.run_dir = Path(run_dir)
        self.hosts = tuple(hosts)
        self.name = name
        self.ready_timeout_s = ready_timeout_s
        self.stop_grace_s = stop_grace_s
        self.env = dict(env or {})
        self.data_dir = self.run_dir / name / "data"
        self.log_path = self.run_dir / "logs" / f"{name}.log"
        self.client_port = 0
        self.peer_port = 0
        self._holds: list[PortHold] = []
        self.process: asyncio.subprocess.Process | None = None

    # -- what the launcher passes on ----------------------------------------------------------

    @property
    def client_url(self) -> str:
        return f"http://{self.hosts[0]}:{self.client_port}"

    @property
    def spec(self) -> str:
        """The --discovery value for every process of the run."""
        return f"etcd://{self.hosts[0]}:{self.client_port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    # -- lifecycle ----------------------------------------------------------------------------

    def _argv(self, binary: str) -> list[str]:
        client_urls = ",".join(f"http://{h}:{self.client_port}" for h in self.hosts)
        peer_url = f"http://127.0.0.1:{self.peer_port}"
        return [
            binary,
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", client_urls,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", peer_url,
            "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"{self.name}={peer_url}",
            "--initial-cluster-state", "new",
            "--initial-cluster-token", f"loadlab-{secrets.token_hex(4)}",
            "--logger", "zap",
            "--log-outputs", "stderr",
        ]  # fmt: skip

    async def start(self) -> str:
        """Start etcd and wait until it serves; returns the spec. LaunchError when it does not
        start (its log tail in the message)."""
        if self.process is not None:
            raise RuntimeError("LocalEtcd already started")
        ok, binary = etcd_available()
        if not ok:
            raise LaunchError(self.name, binary)
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._hold_ports()
        try:
            await self._spawn_and_wait(binary)
        except LaunchError:
            await self.stop()
            raise
        return self.spec

    def _hold_ports(self) -> None:
        """Hold a client port free on every host and a peer port, for etcd's life."""
        for _attempt in range(_PORT_ATTEMPTS):
            self._release_ports()
            first = PortHold(self.hosts[0])
            self._holds = [first, PortHold("127.0.0.1")]
            try:
                for host in self.hosts[1:]:
                    self._holds.append(PortHold(host, first.port))
            except OSError:
                continue  # the port is taken on another host: pick again
            self.client_port, self.peer_port = first.port, self._holds[1].port
            return
        self._release_ports()
        raise LaunchError(self.name, f"no client port free on every host of {self.hosts}")

    def _release_ports(self) -> None:
        for hold in self._holds:
            hold.close()
        self._holds = []

    async def _spawn_and_wait(self, binary: str) -> None:
        from lab.shared.pdeath import through_pdeath

        with open(self.log_path, "ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                *through_pdeath(self._argv(binary)),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                env={**os.environ, **self.env},
            )
        deadline = time.monotonic() + self.ready_timeout_s
        async with aiohttp.ClientSession() as http:
            while True:
                if self.process.returncode is not None:
                    raise self._error(f"exited with code {self.process.returncode}")
                if await self._serves(http):
                    return
                if time.monotonic() > deadline:
                    raise self._error(
                        f"not serving {self.client_url} after {self.ready_timeout_s}s"
                    )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.process.wait(), 0.1)

    async def _serves(self, http: aiohttp.ClientSession) -> bool:
        try:
            async with http.post(
                self.client_url + "/v3/kv/range",
                data=b'{"key":"AA=="}',
                timeout=aiohttp.ClientTimeout(total=2),
            ) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    def _error(self, reason: str) -> LaunchError:
        try:
            tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-15:])
        except OSError:
            tail = ""
        return LaunchError(self.name, reason, tail, self.log_path)

    async def restart(self) -> None:
        """Stop etcd and start it again on the same ports and data dir (keys and leases survive;
        clients see their connections drop). For fault tests."""
        if not self.client_port:
            raise RuntimeError("LocalEtcd.restart before start")
        await self._stop_process()  # the ports stay held: etcd comes back on them
        ok, binary = etcd_available()
        if not ok:
            raise LaunchError(self.name, binary)
        try:
            await self._spawn_and_wait(binary)
        except LaunchError:
            await self.stop()
            raise

    async def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after the grace; returns the exit code (None if never started;
        -15 is etcd's normal graceful exit: it shuts down, then re-raises SIGTERM).
        Idempotent. The data dir stays in the run directory; the ports are released."""
        code = await self._stop_process()
        self._release_ports()
        return code

    async def _stop_process(self) -> int | None:
        proc = self.process
        if proc is None:
            return None
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), self.stop_grace_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        self.process = None
        return proc.returncode

    async def __aenter__(self) -> LocalEtcd:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
