"""The command lines of the fleet: `mocker serve`, `lab sidecar`, `lab frontend`.

Programs are found beside the running interpreter (the venv's console scripts). Tests replace
them with stand-ins through LAB_LAUNCH_MOCKER / LAB_LAUNCH_LAB (shell-quoted argv prefixes).
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from lab.shared.switches import on_off
from launch.topology import FleetSpec, TopologySpec

LISTEN_HOST = "127.0.0.1"


def _console_script(name: str, module_fallback: list[str]) -> list[str]:
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return [str(beside)]
    found = shutil.which(name)
    if found:
        return [found]
    return [sys.executable, *module_fallback]


@dataclass
class Programs:
    """argv prefixes of the two executables the launcher runs."""

    mocker: list[str] = field(default_factory=list)
    lab: list[str] = field(default_factory=list)

    @classmethod
    def default(cls) -> Programs:
        mocker = os.environ.get("LAB_LAUNCH_MOCKER")
        lab = os.environ.get("LAB_LAUNCH_LAB")
        return cls(
            mocker=shlex.split(mocker) if mocker else _console_script("mocker", ["-m", "mocker"]),
            lab=shlex.split(lab) if lab else _console_script(
                "lab", ["-c", "import sys; from lab.cli import main; sys.exit(main())"]),
        )


def new_instance_id(engine_name: str) -> str:
    """`<engine name>-<8 hex>`: new at every start, so a restarted engine is a new instance."""
    return f"{engine_name}-{secrets.token_hex(4)}"


def engine_argv(programs: Programs, spec: TopologySpec, fleet: FleetSpec,
                instance_id: str, port: int = 0, host: str = LISTEN_HOST) -> list[str]:
    """port 0: the OS picks; a restarted engine asks for its previous port first, so that its
    sidecar's --engine address stays valid. `host`: the address to bind (a placed fleet binds
    its host's address)."""

    argv = [
        *programs.mocker, "serve",
        "--listen", f"{host}:{port}",
        "--role", fleet.role,
        "--model", spec.model,
        "--speedup-ratio", repr(float(fleet.speedup)),
        "--decode-speedup-ratio", repr(float(fleet.decode_speedup)),
        "--stream-interval", str(fleet.stream_interval),
        "--instance-id", instance_id,
        # Fault injection (`lab fault`) on an address of its own; a hand-launched engine has none.
        "--admin-listen", f"{host}:0",
    ]
    if spec.tokenizer is not None:  # the engines emit only ids of the frontend's vocabulary
        argv += ["--tokenizer", spec.tokenizer]
    if fleet.engine_args:
        argv += ["--engine-args", json.dumps(fleet.engine_args, separators=(",", ":"))]
    return argv + list(fleet.extra_mocker_args)


def sidecar_argv(programs: Programs, spec: TopologySpec, fleet: FleetSpec, engine_address: str,
                 discovery: str, worker_id: str, host: str = LISTEN_HOST) -> list[str]:
    """`host`: the request-plane address to bind and advertise in discovery."""
    return [
        *programs.lab, "sidecar",
        "--engine", engine_address,
        "--listen", f"{host}:0",
        "--discovery", discovery,
        "--worker-id", worker_id,
        "--server-nodelay", on_off(spec.sockets.server_nodelay),
        *fleet.extra_sidecar_args,
    ]


def frontend_argv(programs: Programs, spec: TopologySpec, discovery: str,
                  host: str = LISTEN_HOST) -> list[str]:
    s = spec.sockets
    argv = [
        *programs.lab, "frontend",
        "--listen", f"{host}:{spec.frontend_port}",
        "--discovery", discovery,
        "--router", spec.router,
        "--client-nodelay", on_off(s.client_nodelay),
        "--pool-size", str(s.pool_size),
        "--http-nodelay", on_off(s.http_nodelay),
        "--migration-limit", str(spec.migration_limit),
        "--model-name", spec.model,
    ]
    if s.split_writes:
        argv.append("--split-writes")
    if spec.enforce_disagg:
        argv.append("--enforce-disagg")
    if spec.tokenizer is not None:
        argv += ["--tokenizer", spec.tokenizer]
    for role, count in spec.expected_workers().items():
        argv += ["--expect", f"{role}={count}"]
    return argv + list(spec.extra_frontend_args)
