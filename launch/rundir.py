"""Run directories: results/<YYYYmmdd-HHMMSS>-<name>, or --out DIR."""

from __future__ import annotations

import time
from pathlib import Path

from launch.errors import RunError

RESULTS_DIR = Path("results")  # relative to the current directory


def make_run_dir(name: str, out: Path | str | None = None, base: Path | None = None) -> Path:
    """Create and return a fresh run directory.

    With `out`: that directory (RunError if it exists and is not empty). Otherwise
    `<base or ./results>/<timestamp>-<name>` (suffixed -2, -3, ... if taken in the same second).
    """
    if out is not None:
        path = Path(out)
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise RunError(f"--out {path}: exists and is not an empty directory")
        path.mkdir(parents=True, exist_ok=True)
        return path
    base = RESULTS_DIR if base is None else Path(base)
    base.mkdir(parents=True, exist_ok=True)
    stem = f"{time.strftime('%Y%m%d-%H%M%S')}-{name}"
    for n in range(1, 1000):
        path = base / (stem if n == 1 else f"{stem}-{n}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise RunError(f"cannot create a run directory under {base}")


def resolve_run(run: str, base: Path | None = None) -> Path:
    """RUN = a run directory path, or a name under results/ (exact, or the newest `*-<name>`)."""
    base = RESULTS_DIR if base is None else Path(base)
    path = Path(run)
    if path.is_dir():
        return path
    candidate = base / run
    if candidate.is_dir():
        return candidate
    if base.is_dir():
        matches = sorted(p for p in base.iterdir() if p.is_dir() and p.name.endswith(f"-{run}"))
        if matches:
            return matches[-1]
    raise RunError(f"RUN {run!r}: no such run directory (nor a run named so under {base}/)")
