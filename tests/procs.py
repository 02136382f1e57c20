"""Real processes for tests: start in their own process group, log to a file, wait for the
ready line, and always kill the whole group at teardown (see the `spawn` fixture in conftest)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from lab.wire.ready import parse_ready


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log_path: Path
    ready: dict[str, str] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return self.ready["listen"]

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 30.0) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.log().splitlines():
                fields = parse_ready(line)
                if fields:
                    self.ready = fields
                    return fields
            if self.popen.poll() is not None:
                code = self.popen.returncode
                tail = self.log()[-3000:]
                raise RuntimeError(f"{self.name} exited with {code} before ready:\n{tail}")
            time.sleep(0.05)
        raise TimeoutError(f"{self.name} not ready in {timeout}s:\n{self.log()[-3000:]}")

    def wait_log(self, text: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log():
                return
            time.sleep(0.05)
        raise TimeoutError(f"{text!r} not in {self.name}'s log:\n{self.log()[-3000:]}")

    def signal(self, sig: int) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, sig)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM the group, then SIGKILL what is left; returns the exit code."""
        try:
            os.killpg(self.popen.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            return self.popen.wait(5)
        except subprocess.TimeoutExpired:
            return None


def stop_all(procs: Iterable[Proc], timeout: float) -> None:
    """SIGTERM every process's group at once, then `stop` each with `timeout`: processes that
    take seconds to exit (Dynamo's) wait together, not one after another."""
    procs = list(procs)
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.popen.pid, signal.SIGTERM)
    for proc in procs:
        proc.stop(timeout=timeout)


def start(name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None) -> Proc:
    """Start `argv` (a list; "python" is replaced by this interpreter) in its own process group."""
    if argv and argv[0] == "python":
        argv = [sys.executable, *argv[1:]]
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    log_file = open(log_path, "ab")  # noqa: SIM115 - handed to the child
    popen = subprocess.Popen(
        argv,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    log_file.close()
    return Proc(name=name, popen=popen, log_path=log_path)


# --- command lines of the fleet's processes, for tests that start them one by one --------------
# (The launcher builds its own from a TopologySpec: launch.commands. These are the plain forms
# the process tests need; "python" is replaced by this interpreter in `start`.)

LAB_ARGV = ["python", "-c", "from lab.cli import main; main()"]
MOCKER_ARGV = ["python", "-m", "mocker"]


def mocker_argv(
    *extra: str,
    role: str | None = None,
    instance_id: str | None = None,
    speedup: float | None = None,
    admin: bool = False,
) -> list[str]:
    """`mocker serve` on a free loopback port; unset options keep the server's defaults.
    `admin`: the fault-injection service on a free port of its own (the ready line's `admin`)."""
    argv = [*MOCKER_ARGV, "serve", "--listen", "127.0.0.1:0"]
    if admin:
        argv += ["--admin-listen", "127.0.0.1:0"]
    if role is not None:
        argv += ["--role", role]
    if speedup is not None:
        argv += ["--speedup-ratio", str(speedup)]
    if instance_id is not None:
        argv += ["--instance-id", instance_id]
    return argv + list(extra)


def sidecar_argv(
    engine: str, discovery_dir: str | Path, worker_id: str, *extra: str, grace_s: float = 0.2
) -> list[str]:
    """A sidecar with a short SIGTERM grace period (tests stop many processes)."""
    return [
        *LAB_ARGV,
        "sidecar",
        "--engine",
        engine,
        "--listen",
        "127.0.0.1:0",
        "--discovery",
        f"file:{discovery_dir}",
        "--worker-id",
        worker_id,
        "--grace-period",
        str(grace_s),
        *extra,
    ]


def frontend_argv(discovery_dir: str | Path, *extra: str) -> list[str]:
    return [
        *LAB_ARGV,
        "frontend",
        "--listen",
        "127.0.0.1:0",
        "--discovery",
        f"file:{discovery_dir}",
        *extra,
    ]


def engine_load(address: str, timeout: float = 5.0) -> dict[str, int]:
    """The engine's GetLoad (running / queued requests), over a short-lived gRPC channel."""
    import grpc

    from lab.wire.gen.openengine.v1 import openengine_pb2_grpc, server_pb2

    with grpc.insecure_channel(address) as channel:
        info = openengine_pb2_grpc.ControlStub(channel).GetLoad(
            server_pb2.GetLoadRequest(), timeout=timeout
        )
    return {"running": info.running_requests, "queued": info.queued_requests}
