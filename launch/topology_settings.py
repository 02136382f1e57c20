"""The topology options of `lab up`, `lab sweep`, `lab nagle` and `lab render k8s`, as one
settings model (lab.shared.config_cli): each field is one flag.

Every field defaults to None ("not given"), so that a flag overrides a value from `--topology
FILE.toml` only when the user passed it. A field that sets a topology value is that value's
field (`given_or_default` of `launch.topology.FleetSpec`, `TopologySpec` or `SocketSettings`,
which are themselves the processes' settings where they are one, e.g. `--stream-interval` is
`EngineSettings.stream_interval`): the same name, bounds, help and default, defined once.
"""

from __future__ import annotations

from pathlib import Path

import click

from lab.shared.config_cli import Settings, given_or_default, setting
from lab.shared.frontend_settings import FrontendSettings
from lab.shared.settings import SocketSettings
from lab.shared.sidecar_settings import SidecarSettings
from launch.topology import FleetSpec, TopologySpec

_SPLIT = SocketSettings().split_writes


def _fleet_size(help: str) -> int | None:
    return given_or_default(FleetSpec, "count", help, default_text="1")


def _engine_args(help: str, default_text: str | None = None) -> str | None:
    return setting(None, help, metavar="JSON|FILE", default_text=default_text)


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
    speedup: float | None = given_or_default(FleetSpec, "speedup")
    decode_speedup: float | None = given_or_default(FleetSpec, "decode_speedup")
    stream_interval: int | None = given_or_default(FleetSpec, "stream_interval")
    engine_args: str | None = _engine_args(
        "Engine arguments for every engine (JSON object or a JSON file).", "{}")
    prefill_engine_args: str | None = _engine_args(
        "Engine arguments for prefill engines, over --engine-args.")
    decode_engine_args: str | None = _engine_args(
        "Engine arguments for decode engines, over --engine-args.")
    router: str | None = given_or_default(TopologySpec, "router")
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
    frontend_port: int | None = given_or_default(TopologySpec, "frontend_port")
    discovery: str | None = setting(
        None, "Discovery store: file:DIR, etcd://HOST:PORT[/prefix], or etcd (start a local "
        "etcd for the run).", metavar="SPEC", default_text="file:<run dir>/discovery")
    restart_engine: str | None = given_or_default(FleetSpec, "restart_engine")
    restart_sidecar: str | None = given_or_default(FleetSpec, "restart_sidecar")
    model: str | None = given_or_default(TopologySpec, "model")
    tokenizer: str | None = setting(
        None, "A HuggingFace tokenizer.json, or a local model directory holding one (no hub "
        "access). The launched frontend tokenizes prompts and detokenizes output with it, and "
        "`lab sweep` builds prompts of exactly --isl tokens in it (with --target: only the "
        "prompts).", metavar="PATH",
        default_text="the frontend's word tokenizer, one token per word")
    add_special_tokens: bool | None = given_or_default(
        TopologySpec, "add_special_tokens",
        "Frontend: encode a prompt with --tokenizer's special tokens (its BOS), as vLLM's "
        "/v1/completions does (one more prompt token per request).",
        negation="--no-add-special-tokens")
    migration_limit: int | None = given_or_default(TopologySpec, "migration_limit")
    enforce_disagg: bool | None = given_or_default(
        TopologySpec, "enforce_disagg",
        "Frontend: fail requests instead of falling back when no prefill worker is up.",
        negation="--no-enforce-disagg")
    name: str | None = given_or_default(TopologySpec, "name")
    ready_timeout_s: float | None = given_or_default(TopologySpec, "ready_timeout_s")
    grace_s: float | None = given_or_default(TopologySpec, "grace_s")

