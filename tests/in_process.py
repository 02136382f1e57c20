"""`lab` commands run inside the test's own process, through the `lab` group itself.

Why: a `lab sweep` started as a new interpreter imports pandas, matplotlib, pyarrow, the
launcher and the report (2-3 s on a 2-core machine) before it launches anything, and every
sweep of the suite paid that again. In process the command, its options, its launched stack
(real processes on real sockets) and its run directory are the same; only the interpreter is
shared. Tests of what a signal does to the `lab` process itself keep a real subprocess
(tests/commands/test_sweep_interrupt.py), as do `lab up --detach` and `lab down`, whose
detached launcher must outlive the command, and the Nagle probes, whose timing is measured.
"""

from __future__ import annotations

from dataclasses import dataclass

from click.testing import CliRunner

from lab.cli import main


@dataclass(frozen=True)
class Ran:
    """What a finished `lab` command left: the fields of a subprocess.CompletedProcess the
    tests read."""

    returncode: int
    stdout: str
    stderr: str


def lab(*args: str) -> Ran:
    """`lab ARGS...` in this process; an exception the command did not turn into an exit code
    is raised here, with its traceback, rather than hidden in the result."""
    result = CliRunner().invoke(main, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Ran(result.exit_code, result.stdout, result.stderr)
