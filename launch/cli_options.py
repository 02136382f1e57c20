"""The topology options shared by `lab up`, `lab sweep`, `lab nagle` and `lab render k8s`.

    @click.command()
    @topology_options
    def up(**kwargs):
        spec = spec_from_options(**kwargs)   # ignores keys that are not topology options

The options are generated from `launch.topology_settings.TopologySettings` (one field, one
flag; lab.shared.config_cli), whose fields are the topology's own (`launch.topology`): a given
option sets the field of the same name (on every fleet for a fleet's field, on the sockets for
a socket setting) over the value from `--topology FILE.toml`, validated as that field.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import click
from pydantic import ValidationError

from lab.shared.config_cli import field_options, fields_of, flag_of, parse_settings
from lab.shared.settings import SocketSettings
from launch.errors import TopologyError
from launch.topology import FleetSpec, TopologySpec, parse_engine_args
from launch.topology_settings import TopologySettings

#: Decorate a click command with every topology option (flat keywords, for spec_from_options).
topology_options = field_options(TopologySettings)
TOPOLOGY_OPTION_NAMES = frozenset(TopologySettings.model_fields)

#: The options that shape the spec rather than set one of its fields.
_SHAPE = ("topology", "engines", "disagg", "prefill", "decode", "engine_args",
          "prefill_engine_args", "decode_engine_args", "tokenizer")
_FLEET = frozenset(fields_of(FleetSpec))
_SOCKETS = frozenset(fields_of(SocketSettings))


def _bad(option: str, message: str) -> click.BadParameter:
    return click.BadParameter(message, param_hint=f"'{option}'")


def _refused(exc: ValidationError, name: str) -> click.BadParameter:
    """A value the spec's field refused, naming the option that gave it."""
    msg = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
    return _bad(flag_of(TopologySettings, name), msg)


def spec_from_options(**kwargs: Any) -> TopologySpec:
    """Build and validate a TopologySpec from the topology options (other keys are ignored).

    Raises click.BadParameter / click.UsageError (exit 2) naming the option or file at fault.
    """
    return spec_from_settings(parse_settings(TopologySettings, kwargs))


def _shape(settings: TopologySettings) -> TopologySpec:
    """The spec of --topology FILE, or of --engines / --disagg --prefill --decode."""
    shape_given = [flag_of(TopologySettings, key) for key in ("engines", "disagg", "prefill",
                                                               "decode")
                   if getattr(settings, key)]
    disagg = bool(settings.disagg or settings.prefill or settings.decode)
    if settings.engines is not None and disagg:
        raise click.UsageError("--engines is for aggregated topologies; use --prefill/--decode "
                               "with --disagg")
    if settings.topology is not None:
        if shape_given:
            raise click.UsageError(
                f"{', '.join(shape_given)} cannot be combined with --topology "
                "(the file defines the fleets)"
            )
        try:
            return TopologySpec.from_toml(settings.topology)
        except TopologyError as exc:
            raise _bad("--topology", str(exc)) from exc
    if disagg:
        return TopologySpec(fleets=[FleetSpec("prefill", count=settings.prefill or 1),
                                    FleetSpec("decode", count=settings.decode or 1)])
    return TopologySpec(fleets=[FleetSpec("aggregated", count=settings.engines or 1)])


def _engine_args(spec: TopologySpec, settings: TopologySettings) -> None:
    """--engine-args over every fleet's, --prefill/--decode-engine-args over their role's."""
    try:
        base_args = (parse_engine_args(settings.engine_args, "--engine-args")
                     if settings.engine_args is not None else None)
        role_args = {
            role: parse_engine_args(getattr(settings, f"{role}_engine_args"),
                                    f"--{role}-engine-args")
            for role in ("prefill", "decode")
            if getattr(settings, f"{role}_engine_args") is not None
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


def spec_from_settings(settings: TopologySettings) -> TopologySpec:
    """The TopologySpec of the topology options given (see spec_from_options)."""
    spec = _shape(settings)
    _engine_args(spec, settings)
    sockets: dict[str, Any] = {}
    for name in TopologySettings.model_fields:
        value = getattr(settings, name)
        if value is None or name in _SHAPE:
            continue
        try:
            if name in _SOCKETS:
                sockets[name] = value
            elif name in _FLEET:
                for fleet in spec.fleets:
                    setattr(fleet, name, value)
            else:
                setattr(spec, name, value)
        except ValidationError as exc:
            raise _refused(exc, name) from None
    if sockets:
        spec.sockets = dataclasses.replace(spec.sockets, **sockets)
    if settings.tokenizer is not None:
        from lab.shared.hf_tokenizer import TokenizerFileError, load_hf, tokenizer_json

        try:
            load_hf(settings.tokenizer)  # a file that does not load fails here, not at launch
            spec.tokenizer = str(tokenizer_json(settings.tokenizer))
        except TokenizerFileError as exc:
            raise _bad("--tokenizer", str(exc)) from exc
    try:
        spec.validate()
    except TopologyError as exc:
        raise (_bad("--topology", str(exc)) if settings.topology is not None
               else click.UsageError(str(exc))) from exc
    return spec
