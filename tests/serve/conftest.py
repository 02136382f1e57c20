"""Fixtures of the serving-path tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab.serve.discovery.file_store import FileRegistry


@pytest.fixture
def disc(tmp_path: Path) -> Path:
    """A file-discovery directory for the test's processes (created, empty)."""
    path = tmp_path / "disc"
    path.mkdir()
    return path


@pytest.fixture
def registry(disc: Path) -> FileRegistry:
    """What the test reads `disc`'s workers with."""
    return FileRegistry(disc)
