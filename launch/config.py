"""config.json of a run: every setting, versions, git commit, machine.

write_config() merges into an existing config.json, so `lab sweep` can add its own section:

    write_config(run_dir, extra={"sweep": {...}})
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from launch.topology import TopologySpec

PACKAGES = (
    "loadlab", "grpcio", "grpcio-health-checking", "protobuf", "uvloop", "psutil", "pandas",
    "pyarrow", "matplotlib", "click", "blake3", "aiohttp", "orjson", "rich",
)
CODE_ROOT = Path(__file__).resolve().parents[1]


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_info(root: Path = CODE_ROOT) -> dict[str, Any]:
    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                                 text=True, timeout=5, check=True)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip()

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status)}


def machine_info() -> dict[str, Any]:
    model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    return {
        "cpu_count": os.cpu_count(),
        "cpu_affinity": affinity,
        "cpu_model": model or platform.processor() or None,
        "kernel": platform.release(),
        "system": platform.system(),
        "machine": platform.machine(),
        "hostname": platform.node(),
    }


def environment() -> dict[str, Any]:
    """Versions, git commit and machine (what every config.json carries)."""
    return {
        "versions": {"python": sys.version.split()[0], "packages": package_versions()},
        "git": git_info(),
        "machine": machine_info(),
    }


def write_config(
    run_dir: Path,
    spec: TopologySpec | None = None,
    extra: dict[str, Any] | None = None,
    **resolved: Any,
) -> dict[str, Any]:
    """Merge the spec (+ resolved settings such as the discovery actually used), the environment
    and `extra` (top-level keys, replacing existing ones) into run_dir/config.json."""
    path = Path(run_dir) / "config.json"
    config: dict[str, Any] = {}
    if path.exists():
        try:
            config = json.loads(path.read_text())
        except ValueError:
            config = {}
    if "versions" not in config:
        config.update(environment())
        config["created"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        config["command"] = sys.argv
        config["run_dir"] = str(Path(run_dir).resolve())
    if spec is not None:
        config["topology"] = {**spec.to_dict(), **resolved}
    if extra:
        config.update(extra)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(config, indent=2, sort_keys=False, default=str) + "\n")
    tmp.replace(path)
    return config
