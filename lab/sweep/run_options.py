"""The options of a command that writes a run directory and drives the load client (`lab
calibrate`, `lab fidelity`): generated from `lab sweep`'s settings fields, so each option is
written once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from lab.load.client_settings import ClientSettings
from lab.shared.config_cli import Settings, field_option, parse_settings
from lab.sweep.sweep_settings import SweepSettings

F = TypeVar("F", bound=Callable[..., Any])

#: --model of a command that measures a --target.
TARGET_MODEL_HELP = "Model name at the target.  [default: the one it serves]"


def option_of(model: type[Settings], name: str, decls: tuple[str, ...] | None = None,
              **overrides: Any) -> Callable[[F], F]:
    """One field of `model` as one click option of another command (`field_option`: its
    type, bounds, help and default, with `overrides`)."""
    got_decls, kwargs = field_option(model, name, decls, **overrides)
    return click.option(*got_decls, **kwargs)


def run_dir_options(default_name: str) -> Callable[[F], F]:
    """--in-process-client, --client-realtime, --out, --name (default `default_name`),
    --no-plots, --quiet."""
    stack = [
        field_option(ClientSettings, "in_process_client"),
        field_option(ClientSettings, "client_realtime"),
        field_option(SweepSettings, "out"),
        (("--name",), dict(default=default_name, show_default=True, help="Run name.")),
        field_option(SweepSettings, "no_plots"),
        field_option(SweepSettings, "quiet"),
    ]

    def decorate(func: F) -> F:
        for decls, kwargs in reversed(stack):
            func = click.option(*decls, **kwargs)(func)
        return func

    return decorate


def run_client(kw: dict[str, Any], timeout_s: float) -> ClientSettings:
    """The client settings of a command with `run_dir_options` (a clear usage error for a
    combination the settings refuse)."""
    return parse_settings(ClientSettings, {"timeout": timeout_s,
                                           "in_process_client": kw["in_process_client"],
                                           "client_realtime": kw["client_realtime"]})
