"""A real target for the calibrate and fidelity tests: a lab stack (`lab up --detach`) whose
engine runs on the known curve of tests/fidelity/curves.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fidelity.curves import write_true_engine

ROOT = Path(__file__).resolve().parents[2]
LAB = str(Path(sys.executable).with_name("lab"))


def lab(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([LAB, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def lab_popen(*args: str, log: Path) -> subprocess.Popen:
    """`lab ARGS` started in the background, its stdout and stderr going to `log`."""
    with open(log, "w") as f:
        return subprocess.Popen([LAB, *args], stdout=f, stderr=subprocess.STDOUT, text=True,
                                cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.fixture(scope="module")
def true_engine_args(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_true_engine(tmp_path_factory.mktemp("true"))


def lab_stack(stack: Path, engine_args: Path, disagg: bool = False,
              speedup: str = "1") -> Iterator[str]:
    """A detached `lab up` (1 prefill + 1 decode with `disagg`): its URL, `lab down` after."""
    shape = ["--disagg"] if disagg else []
    yield from lab_stack_from(stack, *shape, "--engine-args", str(engine_args), "--speedup",
                              speedup)


def lab_stack_from(stack: Path, *options: str) -> Iterator[str]:
    """A detached `lab up OPTIONS`: its URL, `lab down` after."""
    up = lab("up", "--detach", *options, "--out", str(stack))
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        yield next(w for w in up.stdout.split() if w.startswith("http://"))
    finally:
        down = lab("down", str(stack))
        assert down.returncode == 0, down.stdout + down.stderr


# Module scope: one target stack for a module's `lab fidelity` tests (a stack's start and stop
# cost about 4 s). Each test sends prompts of its own seed, so that no test's prompts are in
# the target's prefix cache from another's; the suite's two tests in test_fidelity_shapes.py
# share a seed and run in file order, and the second asserts no figure.
@pytest.fixture(scope="module")
def true_target(tmp_path_factory: pytest.TempPathFactory,
                true_engine_args: Path) -> Iterator[str]:
    yield from lab_stack(tmp_path_factory.mktemp("target"), true_engine_args)


@pytest.fixture
def true_disagg_target(tmp_path: Path, true_engine_args: Path) -> Iterator[str]:
    """The same curve, 1 prefill + 1 decode engine."""
    yield from lab_stack(tmp_path / "target-disagg", true_engine_args, disagg=True)
