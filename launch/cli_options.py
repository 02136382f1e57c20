"""The topology options shared by `lab up`, `lab sweep` and `lab nagle`.

    @click.command()
    @topology_options
    def up(**kwargs):
        spec = spec_from_options(**kwargs)   # ignores keys that are not topology options

Every option defaults to None ("not given"), so that a flag overrides a value from
`--topology FILE.toml` only when the user passed it; the real defaults live in one place
(launch.topology, lab.shared.settings.SocketSettings) and are shown in --help from there; an
option that is a process's own setting (--stream-interval, --migration-limit) is generated from
that process's settings field (lab.shared.config_cli.field_option).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from lab.shared.config_cli import MAX_SECONDS, FiniteFloatRange, field_option
from lab.shared.engine_settings import EngineSettings
from lab.shared.frontend_settings import FrontendSettings
from lab.shared.settings import (
    DEFAULT_MODEL,
    DEFAULT_ROUTER,
    ROUTERS,
    SocketSettings,
)
from lab.shared.switches import ON_OFF, is_on, on_off
from launch.errors import TopologyError
from launch.topology import (
    DEFAULT_DECODE_SPEEDUP,
    DEFAULT_GRACE_S,
    DEFAULT_NAME,
    DEFAULT_READY_TIMEOUT_S,
    DEFAULT_RESTART_ENGINE,
    DEFAULT_RESTART_SIDECAR,
    DEFAULT_SPEEDUP,
    RESTART_POLICIES,
    FleetSpec,
    TopologySpec,
    parse_engine_args,
)

_SOCKETS = SocketSettings()
# (param decls, click kwargs). Order = order in --help.
_OPTIONS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (("--topology",), dict(
        type=click.Path(dir_okay=False, path_type=Path),
        help="Read the topology from a TOML file (fleets, per-fleet overrides; see "
        "launch/topology.py). Flags below override the file's values.")),
    (("--engines",), dict(
        type=click.IntRange(1, 256),
        help="Aggregated engines (each with its sidecar).  [default: 1]")),
    (("--disagg",), dict(
        is_flag=True, default=None,
        help="Disaggregated: prefill and decode fleets (see --prefill/--decode).")),
    (("--prefill",), dict(
        type=click.IntRange(1, 256),
        help="Prefill engines (implies --disagg).  [default: 1]")),
    (("--decode",), dict(
        type=click.IntRange(1, 256),
        help="Decode engines (implies --disagg).  [default: 1]")),
    field_option(EngineSettings, "speedup_ratio", ("--speedup",), default=None, metavar="R",
                 help=f"Engine speedup ratio (0 = no simulated time).  "
                 f"[default: {DEFAULT_SPEEDUP:g}]"),
    field_option(EngineSettings, "decode_speedup_ratio", ("--decode-speedup",), default=None,
                 metavar="R",
                 help=f"Extra decode speedup ratio.  [default: {DEFAULT_DECODE_SPEEDUP:g}]"),
    field_option(EngineSettings, "stream_interval", default=None),
    (("--engine-args",), dict(
        metavar="JSON|FILE",
        help="Engine arguments for every engine (JSON object or a JSON file).  [default: {}]")),
    (("--prefill-engine-args",), dict(
        metavar="JSON|FILE", help="Engine arguments for prefill engines, over --engine-args.")),
    (("--decode-engine-args",), dict(
        metavar="JSON|FILE", help="Engine arguments for decode engines, over --engine-args.")),
    (("--router",), dict(
        type=click.Choice(ROUTERS),
        help=f"Frontend routing policy.  [default: {DEFAULT_ROUTER}]")),
    (("--client-nodelay",), dict(
        type=ON_OFF,
        help="TCP_NODELAY on the frontend's request-plane sockets.  "
        f"[default: {on_off(_SOCKETS.client_nodelay)}]")),
    (("--server-nodelay",), dict(
        type=ON_OFF,
        help="TCP_NODELAY on the sidecars' accepted request-plane sockets.  "
        f"[default: {on_off(_SOCKETS.server_nodelay)}]")),
    (("--split-writes/--coalesced-writes",), dict(
        default=None,
        help="Write request frames as header + body (split) or in one write (coalesced).  "
        f"[default: {'split' if _SOCKETS.split_writes else 'coalesced'}]")),
    field_option(FrontendSettings, "pool_size", default=None),
    (("--http-nodelay",), dict(
        type=ON_OFF,
        help="TCP_NODELAY on the frontend's accepted HTTP connections.  "
        f"[default: {on_off(_SOCKETS.http_nodelay)}]")),
    (("--port",), dict(
        type=click.IntRange(0, 65535),
        help="Frontend HTTP port (0 = the OS picks a free one).  [default: 0]")),
    (("--discovery",), dict(
        metavar="SPEC",
        help="Discovery store: file:DIR, etcd://HOST:PORT[/prefix], or etcd (start a local "
        "etcd for the run).  [default: file:<run dir>/discovery]")),
    (("--restart-engine",), dict(
        type=click.Choice(RESTART_POLICIES),
        help=f"Restart policy of engines.  [default: {DEFAULT_RESTART_ENGINE}]")),
    (("--restart-sidecar",), dict(
        type=click.Choice(RESTART_POLICIES),
        help=f"Restart policy of sidecars.  [default: {DEFAULT_RESTART_SIDECAR}]")),
    (("--model",), dict(
        help=f"Model name served by engines and frontend.  [default: {DEFAULT_MODEL}]")),
    (("--tokenizer",), dict(
        metavar="PATH",
        help="A HuggingFace tokenizer.json, or a local model directory holding one (no hub "
        "access). The launched frontend tokenizes prompts and detokenizes output with it, and "
        "`lab sweep` builds prompts of exactly --isl tokens in it (with --target: only the "
        "prompts).  [default: the frontend's word tokenizer, one token per word]")),
    field_option(FrontendSettings, "migration_limit", default=None),
    (("--enforce-disagg/--no-enforce-disagg",), dict(
        default=None,
        help="Frontend: fail requests instead of falling back when no prefill worker is up.  "
        "[default: off]")),
    (("--name",), dict(
        help=f"Run name (results/<timestamp>-<name>).  [default: {DEFAULT_NAME}]")),
    (("--ready-timeout",), dict(
        type=FiniteFloatRange(min=0.1, max=MAX_SECONDS), metavar="SECONDS",
        help="Every process must be ready within this time.  "
        f"[default: {DEFAULT_READY_TIMEOUT_S:g}]")),
    (("--grace",), dict(
        type=FiniteFloatRange(min=0, max=MAX_SECONDS), metavar="SECONDS",
        help=f"Teardown: SIGTERM, wait this long, then SIGKILL.  [default: {DEFAULT_GRACE_S:g}]")),
]

TOPOLOGY_OPTION_NAMES = frozenset(
    click.Option(list(decls)).name for decls, _ in _OPTIONS
)


def topology_options(func: Callable) -> Callable:
    """Decorate a click command with every topology option (same names, help and defaults)."""
    for decls, kwargs in reversed(_OPTIONS):
        func = click.option(*decls, **kwargs)(func)
    return func


def _bad(option: str, message: str) -> click.BadParameter:
    return click.BadParameter(message, param_hint=f"'{option}'")


# TopologySpec field -> the option that sets it (for naming a value the spec refuses)
_SPEC_FLAGS = {
    "router": "--router", "frontend_port": "--port", "discovery": "--discovery",
    "model": "--model", "migration_limit": "--migration-limit", "name": "--name",
    "ready_timeout_s": "--ready-timeout", "grace_s": "--grace", "tokenizer": "--tokenizer",
}


def _spec_error(exc: TopologyError, from_file: bool) -> click.UsageError:
    """The spec's own check as a usage error naming the option (the file, when it came from
    --topology and the message names the file's line)."""
    key, sep, message = str(exc).partition(": ")
    flag = _SPEC_FLAGS.get(key)
    if sep and flag is not None:
        return _bad(flag, message)
    if from_file:
        return _bad("--topology", str(exc))
    return click.UsageError(str(exc))


def spec_from_options(**kwargs: Any) -> TopologySpec:
    """Build and validate a TopologySpec from the topology options (other keys are ignored).

    Raises click.BadParameter / click.UsageError (exit 2) naming the option or file at fault.
    """
    opts = {k: kwargs.get(k) for k in TOPOLOGY_OPTION_NAMES}
    shape_given = [
        flag for flag, key in (("--engines", "engines"), ("--disagg", "disagg"),
                               ("--prefill", "prefill"), ("--decode", "decode"))
        if opts[key]
    ]
    disagg = bool(opts["disagg"] or opts["prefill"] or opts["decode"])
    if opts["engines"] is not None and disagg:
        raise click.UsageError("--engines is for aggregated topologies; use --prefill/--decode "
                               "with --disagg")

    if opts["topology"] is not None:
        if shape_given:
            raise click.UsageError(
                f"{', '.join(shape_given)} cannot be combined with --topology "
                "(the file defines the fleets)"
            )
        try:
            spec = TopologySpec.from_toml(opts["topology"])
        except TopologyError as exc:
            raise _bad("--topology", str(exc)) from exc
    elif disagg:
        spec = TopologySpec(fleets=[
            FleetSpec("prefill", count=opts["prefill"] or 1),
            FleetSpec("decode", count=opts["decode"] or 1),
        ])
    else:
        spec = TopologySpec(fleets=[FleetSpec("aggregated", count=opts["engines"] or 1)])

    # fleet-wide settings
    try:
        base_args = (
            parse_engine_args(opts["engine_args"], "--engine-args")
            if opts["engine_args"] is not None else None
        )
        role_args = {
            role: parse_engine_args(opts[f"{role}_engine_args"], f"--{role}-engine-args")
            for role in ("prefill", "decode") if opts[f"{role}_engine_args"] is not None
        }
    except TopologyError as exc:
        raise click.BadParameter(str(exc)) from exc
    for role in role_args:
        if role not in {f.role for f in spec.fleets}:
            raise click.UsageError(f"--{role}-engine-args needs a topology with a {role} fleet")
    for fleet in spec.fleets:
        if base_args is not None:
            fleet.engine_args = {**fleet.engine_args, **base_args}
        if fleet.role in role_args:
            fleet.engine_args = {**fleet.engine_args, **role_args[fleet.role]}
        if opts["speedup"] is not None:
            fleet.speedup = opts["speedup"]
        if opts["decode_speedup"] is not None:
            fleet.decode_speedup = opts["decode_speedup"]
        if opts["stream_interval"] is not None:
            fleet.stream_interval = opts["stream_interval"]
        if opts["restart_engine"] is not None:
            fleet.restart_engine = opts["restart_engine"]
        if opts["restart_sidecar"] is not None:
            fleet.restart_sidecar = opts["restart_sidecar"]

    sockets: dict[str, Any] = {}
    for key in ("client_nodelay", "server_nodelay", "http_nodelay"):
        if opts[key] is not None:
            sockets[key] = is_on(opts[key])
    if opts["split_writes"] is not None:
        sockets["split_writes"] = opts["split_writes"]
    if opts["pool_size"] is not None:
        sockets["pool_size"] = opts["pool_size"]
    if sockets:
        spec.sockets = dataclasses.replace(spec.sockets, **sockets)

    if opts["tokenizer"] is not None:
        from lab.shared.hf_tokenizer import TokenizerFileError, load_hf, tokenizer_json

        try:
            load_hf(opts["tokenizer"])  # a file that does not load fails here, not at launch
            spec.tokenizer = str(tokenizer_json(opts["tokenizer"]))
        except TokenizerFileError as exc:
            raise _bad("--tokenizer", str(exc)) from exc
    for option, field_name in (
        ("router", "router"), ("port", "frontend_port"), ("discovery", "discovery"),
        ("model", "model"), ("migration_limit", "migration_limit"),
        ("enforce_disagg", "enforce_disagg"), ("name", "name"),
        ("ready_timeout", "ready_timeout_s"), ("grace", "grace_s"),
    ):
        if opts[option] is not None:
            setattr(spec, field_name, opts[option])
    try:
        spec.validate()
    except TopologyError as exc:
        raise _spec_error(exc, from_file=opts["topology"] is not None) from exc
    return spec
