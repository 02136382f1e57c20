from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launch.commands import Programs
from tests.launch.helpers import alive, descendants

FAKE = Path(__file__).with_name("fake_proc.py")
FAKE_MOCKER = [sys.executable, str(FAKE), "mocker"]
FAKE_LAB = [sys.executable, str(FAKE), "lab"]


@pytest.fixture
def fakes() -> Programs:
    """Programs that run the stand-ins of tests/launch/fake_proc.py."""
    return Programs(mocker=list(FAKE_MOCKER), lab=list(FAKE_LAB))


@pytest.fixture
def fake_env(tmp_path: Path) -> dict[str, str]:
    """Environment for a `lab up` subprocess that launches the stand-ins."""
    env = {
        **os.environ,
        "LAB_LAUNCH_MOCKER": shlex.join(FAKE_MOCKER),
        "LAB_LAUNCH_LAB": shlex.join(FAKE_LAB),
        "FAKE_TRIGGER_DIR": str(tmp_path),
        "PYTHONUNBUFFERED": "1",
    }
    return env


@pytest.fixture
def no_leftovers() -> Iterator[None]:
    """Fails the test if it leaves a descendant process behind."""
    before = descendants()
    yield
    left = descendants() - before
    # give exiting processes a moment to be reaped
    for _ in range(50):
        left = {pid for pid in left if alive(pid)}
        if not left:
            break
        time.sleep(0.1)
    assert not left, f"processes left behind: {left}"
