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

from lab.shared.config_cli import MAX_SECONDS
from lab.shared.engine_settings import DEFAULT_CONTEXT_LENGTH, EngineSettings
from lab.shared.frontend_settings import FrontendSettings
from lab.shared.reasoning import REASONING_PARSERS, engine_args_reason
from lab.shared.settings import CANARY_PROMPT, SidecarTiming
from lab.shared.sidecar_settings import SidecarSettings
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


def engine_settings(spec: TopologySpec, fleet: FleetSpec, instance_id: str, port: int = 0,
                    host: str = LISTEN_HOST) -> EngineSettings:
    """port 0: the OS picks; a restarted engine asks for its previous port first, so that its
    sidecar's --engine address stays valid. `host`: the address to bind (a placed fleet binds
    its host's address)."""
    return EngineSettings(
        listen=f"{host}:{port}",
        role=fleet.role,
        model=spec.model,
        speedup_ratio=float(fleet.speedup),
        decode_speedup_ratio=float(fleet.decode_speedup),
        stream_interval=fleet.stream_interval,
        instance_id=instance_id,
        # Fault injection (`lab fault`) on an address of its own; a hand-launched engine has none.
        admin_listen=f"{host}:0",
        # the engines emit only ids of the frontend's vocabulary
        tokenizer=spec.tokenizer,
        engine_args=(json.dumps(fleet.engine_args, separators=(",", ":"))
                     if fleet.engine_args else None),
    )


def engine_argv(programs: Programs, spec: TopologySpec, fleet: FleetSpec,
                instance_id: str, port: int = 0, host: str = LISTEN_HOST) -> list[str]:
    settings = engine_settings(spec, fleet, instance_id, port, host)
    return [*programs.mocker, "serve", *settings.to_argv(), *fleet.extra_mocker_args]


#: a sidecar's stall window and readiness probe are at least this many times the longest its
#: engine may take to show a token
STALL_MARGIN = 1.5


def _silence_s(fleet: FleetSpec, prompt_tokens: int) -> float | None:
    """How long `fleet`'s engine takes from a prompt of `prompt_tokens` tokens to its first
    token, alone (TimingModel.prompt_alone_ms); None when its engine args do not load (the
    engine reports them itself)."""
    from mocker.engine.config import EngineArgs
    from mocker.engine.timing import TimingModel

    try:
        args = EngineArgs.from_json({**fleet.engine_args,
                                     "speedup_ratio": float(fleet.speedup),
                                     "decode_speedup_ratio": float(fleet.decode_speedup)})
        return TimingModel(args).prompt_alone_ms(prompt_tokens, args.max_num_batched_tokens) / 1e3
    except (ValueError, OSError, KeyError, TypeError):
        return None


def _at_least(default_s: float, silence_s: float | None) -> float:
    if silence_s is None:
        return default_s
    return min(max(default_s, STALL_MARGIN * silence_s), MAX_SECONDS)


def stall_window_s(fleet: FleetSpec) -> float:
    """The sidecar's stall window for `fleet`'s engines: the default (SidecarTiming.stall_s),
    or STALL_MARGIN times the longest its engine can work with requests in flight and emit no
    token, when that is longer: a prompt of the engine's whole context, alone, through its
    request latency and every prefill chunk. A CPU engine calibrated on this machine took 2.7 s
    for a 2,048-token prefill pass (docs/references.md), and the fixed 2 s window withdrew its
    worker mid-pass and failed every request with 503."""
    return _at_least(SidecarTiming.stall_s, _silence_s(fleet, DEFAULT_CONTEXT_LENGTH - 1))


def probe_timeout_s(fleet: FleetSpec) -> float:
    """The bound of the sidecar's readiness probe (a canary generation of CANARY_PROMPT): the
    default, or STALL_MARGIN times the canary's first token on `fleet`'s engine."""
    return _at_least(SidecarTiming.probe_timeout_s, _silence_s(fleet, len(CANARY_PROMPT)))


def sidecar_settings(spec: TopologySpec, engine_address: str, discovery: str, worker_id: str,
                     host: str = LISTEN_HOST, fleet: FleetSpec | None = None) -> SidecarSettings:
    """`host`: the request-plane address to bind and advertise in discovery; `fleet`: the
    engines', whose timing sets the stall window and the probe's bound (`stall_window_s`,
    `probe_timeout_s`; the defaults without it)."""
    return SidecarSettings(
        engine=engine_address,
        listen=f"{host}:0",
        discovery=discovery,
        worker_id=worker_id,
        server_nodelay=spec.sockets.server_nodelay,
        stall=SidecarTiming.stall_s if fleet is None else stall_window_s(fleet),
        probe_timeout=SidecarTiming.probe_timeout_s if fleet is None else probe_timeout_s(fleet),
    )


def sidecar_argv(programs: Programs, spec: TopologySpec, fleet: FleetSpec, engine_address: str,
                 discovery: str, worker_id: str, host: str = LISTEN_HOST) -> list[str]:
    settings = sidecar_settings(spec, engine_address, discovery, worker_id, host, fleet)
    return [*programs.lab, "sidecar", *settings.to_argv(), *fleet.extra_sidecar_args]


def frontend_settings(spec: TopologySpec, discovery: str,
                      host: str = LISTEN_HOST) -> FrontendSettings:
    s = spec.sockets
    # the engines emit a reasoning span: the frontend splits it (docs/mocker.md
    # "Reasoning spans")
    reasons = any(engine_args_reason(f.engine_args) for f in spec.fleets)
    parser: dict[str, str] = {"reasoning_parser": REASONING_PARSERS[0]} if reasons else {}
    return FrontendSettings(
        listen=f"{host}:{spec.frontend_port}",
        discovery=discovery,
        router=spec.router,
        client_nodelay=s.client_nodelay,
        split_writes=s.split_writes,
        pool_size=s.pool_size,
        http_nodelay=s.http_nodelay,
        migration_limit=spec.migration_limit,
        model_name=spec.model,
        enforce_disagg=spec.enforce_disagg,
        tokenizer=spec.tokenizer,
        add_special_tokens=spec.add_special_tokens,
        expect=spec.expected_workers(),
        **parser,  # type: ignore[arg-type]
    )


def frontend_argv(programs: Programs, spec: TopologySpec, discovery: str,
                  host: str = LISTEN_HOST) -> list[str]:
    settings = frontend_settings(spec, discovery, host)
    return [*programs.lab, "frontend", *settings.to_argv(), *spec.extra_frontend_args]
