"""Every number option of every command, tried with nan, inf, -1 and a huge value.

The options are found from the commands themselves (click introspection of `lab` and `mocker`),
so a new number option is tried without anyone adding it here. Each value is refused with a
one-line error naming the option, or it is listed in ACCEPTED with why it is legitimate.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from lab.cli import SUBCOMMANDS
from lab.cli import main as lab_main
from launch.cli_options import spec_from_options
from mocker.cli import main as mocker_main
from tests.usage_errors import assert_one_line_error

HUGE_INT = str(10**30)
HUGE_FLOAT = "1e300"
# what a command needs besides the option under test (given after it: click converts the
# options in command-line order, so the bad one is refused first)
REQUIRED: dict[str, list[str]] = {
    "lab down": ["RUN"],
    "lab fault": ["RUN", "--process", "p", "--kind", "kill"],
    "lab report": ["RUN"],
    "lab compare": ["RUN1", "RUN2"],
    "lab sidecar": ["--engine", "127.0.0.1:1", "--discovery", "file:/tmp/d"],
    "lab frontend": ["--discovery", "file:/tmp/d"],
    "lab calibrate": ["--target", "http://127.0.0.1:1"],
    "lab fidelity": ["--target", "http://127.0.0.1:1"],
}
# (command, option, value) -> why that value is legitimate there
ACCEPTED: dict[tuple[str, str, str], str] = {
    **{(cmd, "--knee-threshold", HUGE_FLOAT): "a threshold above every step's efficiency: the "
       "knee is the first level" for cmd in ("lab sweep", "lab report")},
    **{(cmd, flag, HUGE_FLOAT): "an engine this much faster than real time spends no simulated "
       "time (like 0)" for cmd, flag in (
           ("lab up", "--speedup"), ("lab up", "--decode-speedup"), ("lab sweep", "--speedup"),
           ("lab sweep", "--decode-speedup"), ("lab nagle", "--speedup"),
           ("lab fidelity", "--speedup"),
           ("mocker serve", "--speedup-ratio"), ("mocker serve", "--decode-speedup-ratio"))},
}


def _commands() -> Iterator[tuple[str, click.Command]]:
    ctx = click.Context(lab_main)
    for name in SUBCOMMANDS:
        command = lab_main.get_command(ctx, name)
        assert command is not None
        yield f"lab {name}", command
    for name, command in mocker_main.commands.items():  # type: ignore[attr-defined]
        yield f"mocker {name}", command


def number_options() -> Iterator[tuple[str, click.Option]]:
    for path, command in _commands():
        for param in command.params:
            if isinstance(param, click.Option) and isinstance(
                    param.type, click.types.IntParamType | click.types.FloatParamType):
                yield path, param


def _huge(option: click.Option) -> str:
    return HUGE_INT if isinstance(option.type, click.types.IntParamType) else HUGE_FLOAT


def _cases() -> Iterator[pytest.ParameterSet]:
    for path, option in number_options():
        flag = option.opts[0]
        for value in ("nan", "inf", "-1", _huge(option)):
            yield pytest.param(path, flag, value, id=f"{path} {flag} {value}")


def _invoke(path: str, args: list[str]) -> tuple[int | None, str]:
    program, _, sub = path.partition(" ")
    main = lab_main if program == "lab" else mocker_main
    result = CliRunner().invoke(main, [sub, *args])
    return result.exit_code, result.output


def _parses(path: str, flag: str, value: str) -> object:
    """The value click makes of `flag value` (the command's body is not run)."""
    command = dict(_commands())[path]
    with command.make_context(path, [flag, value, *REQUIRED.get(path, [])]) as ctx:
        source = next(p for p in command.params if p.opts[0] == flag)
        return ctx.params[source.name or ""]


def test_the_list_covers_every_command() -> None:
    found = {path for path, _ in number_options()}
    assert {"lab sweep", "lab up", "lab down", "lab fault", "lab nagle", "lab report",
            "lab sidecar", "lab frontend", "lab calibrate", "lab fidelity", "mocker serve",
            "mocker bench"} <= found


@pytest.mark.parametrize(("path", "flag", "value"), list(_cases()))
def test_every_number_option_refuses_nan_inf_negative_and_huge(path: str, flag: str,
                                                               value: str) -> None:
    why = ACCEPTED.get((path, flag, value))
    if why is not None:
        assert _parses(path, flag, value) is not None, why
        return
    # refused while parsing, before the command's body would start anything
    with pytest.raises(click.UsageError):
        _parses(path, flag, value)
    code, output = _invoke(path, [flag, value, *REQUIRED.get(path, [])])
    assert_one_line_error(code, output, flag)


def test_accepted_values_are_still_number_options() -> None:
    """An ACCEPTED entry whose option was renamed or removed would silently test nothing."""
    known = {(path, option.opts[0]) for path, option in number_options()}
    assert {(path, flag) for path, flag, _ in ACCEPTED} <= known


# The command lines first reported refused wrongly, each as a real process: one error line naming
# the option.
@pytest.mark.parametrize(("argv", "named"), [
    (["lab", "sweep", "--conc", "1", "--ready-timeout", "nan"], "--ready-timeout"),
    (["lab", "sweep", "--grace", "nan"], "--grace"),
    (["lab", "up", "--grace", "nan"], "--grace"),  # reported with --detach: the same parse
    (["lab", "up", "--ready-timeout", "nan"], "--ready-timeout"),
    (["lab", "up", "--ready-timeout", "inf"], "--ready-timeout"),
    (["lab", "up", "--speedup", "inf"], "--speedup"),
    (["lab", "up", "--decode-speedup", "inf"], "--decode-speedup"),
    (["lab", "up", "--speedup", "nan"], "--speedup"),
    (["lab", "up", "--discovery", "bogus:x"], "--discovery"),
    (["mocker", "serve", "--stall-timeout", "nan"], "--stall-timeout"),
], ids=" ".join)
def test_the_reported_command_lines_fail_in_one_line(argv: list[str], named: str,
                                                      tmp_path: Path) -> None:
    module = "lab.cli" if argv[0] == "lab" else "mocker.cli"
    # its own session: a command line that is wrongly accepted starts a stack, which is then
    # stopped as a whole (SIGTERM to the group: the launcher tears down what it started)
    out = ["--out", str(tmp_path / "run")] if argv[0] == "lab" else []
    proc = subprocess.Popen([sys.executable, "-m", module, *argv[1:], *out], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
        pytest.fail(f"{' '.join(argv)} was accepted (still running after 60 s):\n{output}")
    assert_one_line_error(proc.returncode, output, named)


@pytest.mark.parametrize("line", ["grace_s = nan", "ready_timeout_s = inf", "grace_s = 1e300",
                                  "speedup = nan"])
def test_a_topology_file_refuses_the_same_values(tmp_path: Path, line: str) -> None:
    """TOML spells nan and inf too: the file is checked like the flags."""
    path = tmp_path / "t.toml"
    path.write_text(f"{line}\n[[fleet]]\nrole = \"aggregated\"\n")
    with pytest.raises(click.BadParameter) as err:  # (not `lab up`: accepted, it would launch)
        spec_from_options(topology=path)
    message = err.value.format_message()
    assert "--topology" in message and f"t.toml:1: {line.split()[0]}" in message, message
