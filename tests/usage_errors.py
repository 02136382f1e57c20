"""Command-line usage errors: a bad value exits 2 naming what is wrong, never with a traceback.

`usage_cases` parametrizes ("args", "named") from command lines, so that a table of bad values
need not spell each option twice; `assert_usage_error` is what every such case checks."""

from __future__ import annotations

import shlex

import pytest


def _last_option(args: list[str]) -> str:
    options = [a for a in args if a.startswith("--")]
    assert options, f"no option in {args}"
    return options[-1]


def usage_cases(*cases: str | tuple[str, str]) -> pytest.MarkDecorator:
    """`parametrize(("args", "named"), ...)`: a case is a command line (split as a shell would),
    whose last option is the one the error must name, or (a command line, what it must name).
    A case's id is its command line."""
    params = []
    for case in cases:
        line, named = case if isinstance(case, tuple) else (case, None)
        args = shlex.split(line)
        params.append(pytest.param(args, named or _last_option(args), id=line))
    return pytest.mark.parametrize(("args", "named"), params)


def assert_usage_error(exit_code: int | None, output: str, named: str) -> None:
    assert exit_code == 2, output
    assert named in output, output
    assert "Traceback" not in output, output


def assert_one_line_error(exit_code: int | None, output: str, named: str) -> None:
    """Exit 2 with exactly one `Error:` line, which names `named`, and no traceback."""
    assert_usage_error(exit_code, output, named)
    errors = [line for line in output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and named in errors[0], output
    assert errors[0].removeprefix("Error:").strip(), output  # not an empty "Error: "
