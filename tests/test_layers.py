"""The packages import one way (docs/architecture.md, "Layers and who may import whom").

`launch` sits above the serving path's shared settings and constants and below the `lab`
commands: it may import only the `lab` modules listed in LAUNCH_MAY_IMPORT, and none of those
(nor anything in the serving path, the wire layer or the mocker) may import `launch`. Imports
inside functions count too: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The shared bottom of `lab` that the launcher builds on: settings, constants, parsing.
LAUNCH_MAY_IMPORT = (
    "lab.serve.settings",
    "lab.serve.router",
    "lab.serve.switches",
    "lab.wire",
    "lab.hf_tokenizer",
)
#: Layers that must not know the launcher exists.
NEVER_IMPORT_LAUNCH = ("lab/serve", "lab/wire", "lab/analysis", "lab/report", "mocker")
#: The one exception below the commands: the load client's isolated process dies with its
#: parent through the launcher's PR_SET_PDEATHSIG helper.
ALLOWED_EXCEPTIONS = {("lab/load/client.py", "launch.pdeath")}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _files(top: str) -> list[Path]:
    return [p for p in (ROOT / top).rglob("*.py") if "gen" not in p.relative_to(ROOT).parts]


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_launch_imports_only_the_shared_bottom_of_lab() -> None:
    bad = sorted(
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _files("launch")
        for name in _imports(path)
        if _under(name, ("lab",)) and not _under(name, LAUNCH_MAY_IMPORT)
    )
    assert not bad, bad


def test_the_serving_path_and_the_shared_bottom_never_import_launch() -> None:
    files = [p for top in NEVER_IMPORT_LAUNCH for p in _files(top)]
    files += [ROOT / (m.replace(".", "/") + ".py") for m in LAUNCH_MAY_IMPORT if m != "lab.wire"]
    files += list(ROOT.glob("lab/load/*.py"))
    bad = sorted(
        f"{path.relative_to(ROOT)} imports {name}"
        for path in files
        for name in _imports(path)
        if _under(name, ("launch",))
        and (str(path.relative_to(ROOT)), name) not in ALLOWED_EXCEPTIONS
    )
    assert not bad, bad
