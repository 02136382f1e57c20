"""Dynamo 1.6.1's own frontend and TensorRT-LLM sidecar (`python -m dynamo.trtllm.sidecar`) in
front of the lab's mockers, as real processes: where the venv is, whether it may be missing,
and how each process is started.

The venv is provisioned by .ci/dynamo-venv into LOADLAB_DYNAMO_VENV (default
~/.cache/loadlab/dynamo-venv). Dynamo runs without etcd or NATS: file discovery in a directory
of the test's own, TCP request plane, ZMQ event plane, every listener with a host setting on
127.0.0.1 (Dynamo's ZMQ publishers bind 0.0.0.0; nothing connects to them from outside).
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import orjson

DYNAMO_VERSION = "1.6.1"
VENV_ENV = "LOADLAB_DYNAMO_VENV"
DEFAULT_VENV = Path.home() / ".cache" / "loadlab" / "dynamo-venv"


def venv_dir() -> Path:
    return Path(os.environ.get(VENV_ENV) or DEFAULT_VENV)


def python() -> Path:
    return venv_dir() / "bin" / "python"


def unusable_reason() -> str | None:
    """None when the venv runs both entry points; else why not."""
    py = python()
    if not py.is_file():
        return f"no Dynamo venv at {venv_dir()} (run .ci/dynamo-venv, or set {VENV_ENV})"
    for module in ("dynamo.frontend", "dynamo.trtllm.sidecar"):
        res = subprocess.run([str(py), "-m", module, "--help"], capture_output=True, timeout=120,
                             check=False)
        if res.returncode != 0:
            tail = res.stderr.decode(errors="replace").strip().splitlines()[-1:]
            return f"{py} -m {module} --help failed: {' '.join(tail)}"
    return None


def unreachable_reason() -> str | None:
    """The reason .ci/dynamo-venv recorded when PyPI could not be reached, if it did."""
    mark = Path(f"{venv_dir()}.unreachable")
    return mark.read_text().strip() if mark.is_file() else None


def env(discovery_dir: Path) -> dict[str, str]:
    """Dynamo's settings for one stack (the same for the frontend and every sidecar)."""
    return {
        "DYN_FILE_KV": str(discovery_dir),
        "DYN_DISCOVERY_BACKEND": "file",
        "DYN_REQUEST_PLANE": "tcp",
        "DYN_EVENT_PLANE": "zmq",
        "DYN_TCP_RPC_HOST": "127.0.0.1",
        "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
        "DYN_EVENT_PLANE_HOST": "127.0.0.1",
        "DYN_SYSTEM_HOST": "127.0.0.1",
        "DYN_HTTP_HOST": "127.0.0.1",
        "DYN_SELF_HOST_METADATA": "0",  # model cards stay in the discovery store
        # info: the frontend's "Prefill worker detected" line is what readiness waits on
        "DYN_LOG": "warn,dynamo_llm::discovery::watcher=info",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


COMMON = ["--discovery-backend", "file", "--request-plane", "tcp"]


def frontend_argv(port: int) -> list[str]:
    return [str(python()), "-m", "dynamo.frontend", "--http-host", "127.0.0.1",
            "--http-port", str(port), "--router-mode", "round-robin", *COMMON]


def sidecar_argv(engine: str, model_dir: Path, mode: str | None = None) -> list[str]:
    """Dynamo's TRT-LLM sidecar in front of `engine` (HOST:PORT); `mode` prefill|decode."""
    argv = [str(python()), "-m", "dynamo.trtllm.sidecar", "--model-path", str(model_dir),
            "--grpc-endpoint", engine, *COMMON]
    if mode is not None:
        argv += ["--disaggregation-mode", mode]
    return argv


def served_models(url: str) -> list[str]:
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as resp:
            return [m.get("id") for m in orjson.loads(resp.read()).get("data", [])]
    except OSError:
        return []


def wait_until(ready: Callable[[], bool], what: str, dead: Callable[[], str | None],
               timeout_s: float) -> None:
    """Poll `ready()` until true; raise when `dead()` names a dead process or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        gone = dead()
        if gone:
            raise RuntimeError(f"{gone} exited while waiting for {what}")
        if ready():
            return
        time.sleep(0.2)
    raise TimeoutError(f"not ready within {timeout_s}s: {what}")
