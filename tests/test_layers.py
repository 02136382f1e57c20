"""The packages import one way (docs/architecture.md, "Layers and who may import whom").

    lab.cli, lab.commands, lab.sweep, lab.nagle, lab.fidelity -> launch -> lab.shared -> lab.wire

`launch` may import only the shared bottom (`lab.shared`, `lab.wire`), which imports nothing
above itself; only the `lab` commands (and the feature packages whose commands launch stacks:
`lab.nagle`, `lab.fidelity`, `lab.sweep`) import `launch`. Imports inside functions count too: a
lazy import is still a dependency. And no module of ours imports itself through others: no
import circle, with imports inside functions counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: The layer below both `lab` and `launch`.
SHARED_BOTTOM = ("lab.shared", "lab.wire")
#: The only modules that may import `launch`: the `lab` command line, and the feature packages
#: that hold a command's own modules (its settings, its runs on a launched stack).
MAY_IMPORT_LAUNCH = ("lab.cli", "lab.commands", "lab.fidelity", "lab.nagle", "lab.sweep")
#: Every package of ours whose modules must not import each other in a circle.
OURS = ("lab", "mocker", "launch", "tests")


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


def _module_names() -> dict[str, Path]:
    """Each of our modules (a package by its `__init__.py`) by dotted name."""
    names = {}
    for path in _files(*OURS):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module of ours that importing `name` runs (`a.b.func` -> `a.b`), or None."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the modules of ours it imports, at any depth of its code (relative imports and
    `from package import module` resolved). A package's `__init__` run on the way to one of its
    modules is not counted: that order is Python's, not a dependency a module chose."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                targets = [f"{base}.{alias.name}" for alias in node.names]
            deps.update(d for t in targets if (d := _resolve(t, modules)) is not None)
        deps.discard(name)
        graph[name] = deps
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, deps = work[-1]
            for dep in deps:
                if dep not in index:
                    index[dep] = low[dep] = len(index)
                    stack.append(dep)
                    on_stack.add(dep)
                    work.append((dep, iter(sorted(graph[dep]))))
                    break
                if dep in on_stack:
                    low[node] = min(low[node], index[dep])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_import_circle_among_our_modules() -> None:
    circles = _circles(_import_graph(_module_names()))
    assert not circles, "import circles (imports inside functions count):\n" + "\n".join(
        " <-> ".join(c) for c in circles)


def test_the_circle_check_sees_a_circle_through_a_function_level_import(tmp_path: Path) -> None:
    """The check would pass vacuously if it stopped reading imports inside functions."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import g\n\ndef f():\n    return g()\n")
    (pkg / "b.py").write_text("def g():\n    from pkg import a\n    return a\n")
    (pkg / "c.py").write_text("from . import a\n")
    modules = {"pkg": pkg / "__init__.py", "pkg.a": pkg / "a.py", "pkg.b": pkg / "b.py",
               "pkg.c": pkg / "c.py"}
    graph = _import_graph(modules)
    assert graph["pkg.c"] == {"pkg.a"}
    assert _circles(graph) == [["pkg.a", "pkg.b"]]
