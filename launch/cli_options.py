"""The topology options shared by `lab up`, `lab sweep`, `lab nagle` and `lab render k8s`.

    @click.command()
    @topology_options
    def up(**kwargs):
        spec = spec_from_options(**kwargs)   # ignores keys that are not topology options

The options are generated from `launch.topology_settings.TopologySettings` (one field, one
flag; lab.shared.config_cli); `spec_from_options` validates them as that model and builds the
TopologySpec: a flag overrides a value from `--topology FILE.toml` only when it was given.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from lab.shared.config_cli import field_options, parse_settings
from launch.errors import TopologyError
from launch.topology import FleetSpec, TopologySpec, parse_engine_args
from launch.topology_settings import TopologySettings

#: Decorate a click command with every topology option (flat keywords, for spec_from_options).
topology_options = field_options(TopologySettings)
TOPOLOGY_OPTION_NAMES = frozenset(TopologySettings.model_fields)


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
    return spec_from_settings(parse_settings(TopologySettings, kwargs))


def spec_from_settings(settings: TopologySettings) -> TopologySpec:
    """The TopologySpec of the topology options given (see spec_from_options)."""
    opts = settings.model_dump()
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
    for key in ("client_nodelay", "server_nodelay", "http_nodelay", "split_writes", "pool_size"):
        if opts[key] is not None:
            sockets[key] = opts[key]
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
