"""The topology options of `lab up`, `lab sweep`, `lab nagle` and `lab render k8s`, as one
settings model (lab.shared.config_cli): each field is one flag.

Every field defaults to None ("not given"), so that a flag overrides a value from `--topology
FILE.toml` only when the user passed it; the real defaults live in one place (launch.topology,
the processes' settings models) and --help shows them from there. A field that is a process's
own setting (`--stream-interval`, `--migration-limit`, the socket switches) is that process's
field (`given_or_default`): the same bounds and help.
"""

from __future__ import annotations

from pathlib import Path

import click

from lab.shared.config_cli import MAX_SECONDS, Settings, given_or_default, setting
from lab.shared.engine_settings import EngineSettings
from lab.shared.frontend_settings import FrontendSettings
from lab.shared.sidecar_settings import SidecarSettings
from launch.topology import (
    DEFAULT_DECODE_SPEEDUP,
    DEFAULT_GRACE_S,
    DEFAULT_NAME,
    DEFAULT_READY_TIMEOUT_S,
    DEFAULT_RESTART_ENGINE,
    DEFAULT_RESTART_SIDECAR,
    DEFAULT_SPEEDUP,
    RESTART_POLICIES,
)

#: The most engines one fleet may have from the command line.
MAX_FLEET = 256
_SPLIT = FrontendSettings.model_fields["split_writes"].default


def _fleet_size(help: str) -> int | None:
    return setting(None, help, ge=1, le=MAX_FLEET, default_text="1")


def _engine_args(help: str, default_text: str | None = None) -> str | None:
    return setting(None, help, metavar="JSON|FILE", default_text=default_text)


def _restart(what: str, default: str) -> str | None:
    return setting(None, f"Restart policy of {what}.", choices=RESTART_POLICIES,
                   default_text=default)


class TopologySettings(Settings):
    """What to launch: the fleets, the engines' and frontend's settings, the run's limits."""

    topology: Path | None = setting(
        None, "Read the topology from a TOML file (fleets, per-fleet overrides; see "
        "launch/topology.py). Flags below override the file's values.",
        path=click.Path(dir_okay=False, path_type=Path))
    engines: int | None = _fleet_size("Aggregated engines (each with its sidecar).")
    disagg: bool | None = setting(
        None, "Disaggregated: prefill and decode fleets (see --prefill/--decode).")
    prefill: int | None = _fleet_size("Prefill engines (implies --disagg).")
    decode: int | None = _fleet_size("Decode engines (implies --disagg).")
    speedup: float | None = given_or_default(
        EngineSettings, "speedup_ratio", "Engine speedup ratio (0 = no simulated time).",
        flag="--speedup", metavar="R", default_text=f"{DEFAULT_SPEEDUP:g}")
    decode_speedup: float | None = given_or_default(
        EngineSettings, "decode_speedup_ratio", "Extra decode speedup ratio.",
        flag="--decode-speedup", metavar="R", default_text=f"{DEFAULT_DECODE_SPEEDUP:g}")
    stream_interval: int | None = given_or_default(EngineSettings, "stream_interval")
    engine_args: str | None = _engine_args(
        "Engine arguments for every engine (JSON object or a JSON file).", "{}")
    prefill_engine_args: str | None = _engine_args(
        "Engine arguments for prefill engines, over --engine-args.")
    decode_engine_args: str | None = _engine_args(
        "Engine arguments for decode engines, over --engine-args.")
    router: str | None = given_or_default(FrontendSettings, "router",
                                          "Frontend routing policy.")
    client_nodelay: bool | None = given_or_default(
        FrontendSettings, "client_nodelay", "TCP_NODELAY on the frontend's request-plane sockets.")
    server_nodelay: bool | None = given_or_default(
        SidecarSettings, "server_nodelay",
        "TCP_NODELAY on the sidecars' accepted request-plane sockets.")
    split_writes: bool | None = given_or_default(
        FrontendSettings, "split_writes",
        "Write request frames as header + body (split) or in one write (coalesced).",
        default_text="split" if _SPLIT else "coalesced")
    pool_size: int | None = given_or_default(FrontendSettings, "pool_size")
    http_nodelay: bool | None = given_or_default(
        FrontendSettings, "http_nodelay", "TCP_NODELAY on the frontend's accepted HTTP "
        "connections.")
    port: int | None = setting(
        None, "Frontend HTTP port (0 = the OS picks a free one).", ge=0, le=65535,
        default_text="0")
    discovery: str | None = setting(
        None, "Discovery store: file:DIR, etcd://HOST:PORT[/prefix], or etcd (start a local "
        "etcd for the run).", metavar="SPEC", default_text="file:<run dir>/discovery")
    restart_engine: str | None = _restart("engines", DEFAULT_RESTART_ENGINE)
    restart_sidecar: str | None = _restart("sidecars", DEFAULT_RESTART_SIDECAR)
    model: str | None = given_or_default(
        FrontendSettings, "model_name", "Model name served by engines and frontend.",
        flag="--model")
    tokenizer: str | None = setting(
        None, "A HuggingFace tokenizer.json, or a local model directory holding one (no hub "
        "access). The launched frontend tokenizes prompts and detokenizes output with it, and "
        "`lab sweep` builds prompts of exactly --isl tokens in it (with --target: only the "
        "prompts).", metavar="PATH",
        default_text="the frontend's word tokenizer, one token per word")
    migration_limit: int | None = given_or_default(FrontendSettings, "migration_limit")
    enforce_disagg: bool | None = given_or_default(
        FrontendSettings, "enforce_disagg",
        "Frontend: fail requests instead of falling back when no prefill worker is up.",
        negation="--no-enforce-disagg")
    name: str | None = setting(None, "Run name (results/<timestamp>-<name>).",
                               default_text=DEFAULT_NAME)
    ready_timeout: float | None = setting(
        None, "Every process must be ready within this time.", ge=0.1, le=MAX_SECONDS,
        metavar="SECONDS", default_text=f"{DEFAULT_READY_TIMEOUT_S:g}")
    grace: float | None = setting(
        None, "Teardown: SIGTERM, wait this long, then SIGKILL.", ge=0, le=MAX_SECONDS,
        metavar="SECONDS", default_text=f"{DEFAULT_GRACE_S:g}")
