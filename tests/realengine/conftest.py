"""One vLLM server shared by every real-engine test (it takes 70-150 s to start on 2 cores).
Skipped only when .ci/vllm-venv recorded that PyPI was unreachable, or when the venv is missing
and CI is not true; under CI=true a missing venv fails."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.interop.model_dir import build_model_dir
from tests.realengine.model import write_model
from tests.realengine.server import VllmServer, start, venv_dir


def _venv_or_skip() -> None:
    venv = venv_dir()
    if (venv / "bin" / "python").exists():
        return
    mark = Path(f"{venv}.unreachable")
    if mark.is_file():
        pytest.skip(mark.read_text().strip())
    reason = f"no vLLM venv at {venv} (run .ci/vllm-venv, or set LOADLAB_VLLM_VENV)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI provisions it with .ci/vllm-venv", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tests' small tokenizer, with the tokenizer_config vLLM's AutoTokenizer reads."""
    return build_model_dir(tmp_path_factory.mktemp("realengine-tok"))


# Package scope: the server stops after this package's last test, so that its processes (the
# EngineCore and Worker busy-poll between steps) do not take a core from the tests after it.
@pytest.fixture(scope="package")
def vllm_server(tokenizer_dir: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    _venv_or_skip()
    work = tmp_path_factory.mktemp("realengine")
    server = start(write_model(tokenizer_dir, work / "model"), work / "server.log")
    try:
        yield server
    finally:
        server.stop()
