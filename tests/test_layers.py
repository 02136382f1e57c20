"""The packages import one way (docs/architecture.md, "Layers and who may import whom").

    lab.cli, lab.commands  ->  launch  ->  lab.shared  ->  lab.wire

`launch` may import only the shared bottom (`lab.shared`, `lab.wire`), which imports nothing
above itself; only the `lab` commands import `launch`. Imports inside functions count too: a
lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: The layer below both `lab` and `launch`.
SHARED_BOTTOM = ("lab.shared", "lab.wire")
#: The only modules that may import `launch`: the `lab` command line.
MAY_IMPORT_LAUNCH = ("lab.cli", "lab.commands")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _files(*tops: str) -> list[Path]:
    return [p for top in tops for p in (ROOT / top).rglob("*.py")
            if "gen" not in p.relative_to(ROOT).parts]


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _violations(files: list[Path], forbidden: tuple[str, ...],
                allowed: tuple[str, ...] = ()) -> list[str]:
    return sorted(
        f"{path.relative_to(ROOT)} imports {name}"
        for path in files
        for name in _imports(path)
        if _under(name, forbidden) and not _under(name, allowed)
    )


def test_launch_imports_only_the_shared_bottom_of_lab() -> None:
    bad = _violations(_files("launch"), ("lab",), allowed=SHARED_BOTTOM)
    assert not bad, bad


def test_only_the_lab_commands_import_launch() -> None:
    files = [p for p in _files("lab", "mocker") if not _under(_module(p), MAY_IMPORT_LAUNCH)]
    assert not _violations(files, ("launch",)), _violations(files, ("launch",))


@pytest.mark.parametrize(("bottom", "allowed"), [
    ("lab/wire", ("lab.wire",)),
    ("lab/shared", SHARED_BOTTOM),
])
def test_the_shared_bottom_imports_nothing_above_itself(bottom: str, allowed: tuple[str, ...]
                                                         ) -> None:
    bad = _violations(_files(bottom), ("lab", "launch", "mocker"), allowed=allowed)
    assert not bad, bad
