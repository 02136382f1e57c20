"""Dynamo 1.6.1's own frontend and TensorRT-LLM sidecar drive the lab's mockers (`mocker serve`,
real processes), aggregated and 1 prefill + 1 decode, loaded by the lab's client (`lab sweep
--target`): no errors, one token per streamed chunk, the server's token counts within 2% of
ISL/OSL, and in disagg each leg on its own worker (the mockers' recorded requests).

The Dynamo venv comes from .ci/dynamo-venv (tests/interop/dynamo_stack.py). These tests skip
only when that script recorded that PyPI could not be reached; a venv missing for any other
reason skips locally with the command to run, and fails under CI=true.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pandas as pd
import pytest
from click.testing import CliRunner

from lab.commands.sweep import sweep
from lab.sweep.leak_check import TARGET_NOTE, engine_load
from lab.wire import constants as wc
from launch.port_hold import PortHold
from mocker.server.pb import generation_pb2
from mocker.server.recorder import list_recorded
from tests.interop import dynamo_stack as dyn
from tests.interop.model_dir import build_model_dir
from tests.procs import Proc, mocker_argv, stop_all
from tests.waiting import wait_for

ISL, OSL, REQUESTS = 64, 16, 12
KV_PORT = "5600"  # published in the handoff only; nothing binds it


def _venv_or_skip() -> None:
    reason = dyn.unusable_reason()
    if reason is None:
        return
    unreachable = dyn.unreachable_reason()
    if unreachable is not None:
        pytest.skip(unreachable)
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}; CI provisions it with .ci/dynamo-venv", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _venv_or_skip()
    return build_model_dir(tmp_path_factory.mktemp("dynamo-model"))


@dataclass
class Stack:
    url: str
    model: str  # the sidecar serves the model dir's path (it has no name option)
    engines: dict[str, Proc]


@pytest.fixture
def dynamo(spawn: Callable[..., Proc], model_dir: Path,
           tmp_path: Path) -> Iterator[Callable[..., Stack]]:
    """start(disagg, *mocker_args) -> Stack: the mockers (speedup 0 unless the extra mocker
    arguments say otherwise), then Dynamo's frontend and a sidecar per mocker; `spawn` stops
    every process group at teardown, whatever the test did."""
    dynamo_procs: list[Proc] = []

    def start(disagg: bool, *mocker_args: str) -> Stack:
        roles = ("prefill", "decode") if disagg else ("aggregated",)
        engines = {
            role: spawn(f"mocker-{role}", mocker_argv(
                "--record-requests", "--kv-port", KV_PORT, "--tokenizer", str(model_dir),
                *(mocker_args or ("--speedup-ratio", "0")), role=role,
                instance_id=f"mocker-{role}"))
            for role in roles
        }
        env = dyn.env(tmp_path / "kvstore")
        hold = PortHold()  # held until Dynamo's frontend serves on it
        port = hold.port
        frontend = spawn("dynamo-frontend", dyn.frontend_argv(port), ready=False, env=env)
        sidecars = [
            spawn(f"dynamo-sidecar-{role}", dyn.sidecar_argv(
                proc.address, model_dir, role if disagg else None), ready=False, env=env)
            for role, proc in engines.items()
        ]
        dynamo_procs.extend([frontend, *sidecars])
        url, model = f"http://127.0.0.1:{port}", str(model_dir)

        def dead() -> str | None:
            for proc in (frontend, *sidecars):
                if proc.popen.poll() is not None:
                    return f"{proc.name} (log: {proc.log()[-2000:]})"
            return None

        def ready() -> bool:
            if model not in dyn.served_models(url):
                return False
            return not disagg or "Prefill worker detected" in frontend.log()

        try:
            dyn.wait_until(ready, f"{url}/v1/models to list {model}", dead, timeout_s=90)
        finally:
            hold.close()
        return Stack(url=url, model=model, engines=engines)

    yield start
    # Dynamo's processes, before `spawn` stops the rest: its prefill sidecar ignores SIGTERM
    # (`spawn` would SIGKILL it after 10 s) and the others take ~5 s to exit cleanly, one after
    # another. How Dynamo exits is not what these tests check: SIGTERM them all at once, then
    # give them 2 s.
    stop_all(dynamo_procs, timeout=2)


def sweep_through(stack: Stack, model_dir: Path, out: Path) -> pd.DataFrame:
    result = CliRunner().invoke(sweep, [
        "--target", stack.url, "--model", stack.model, "--tokenizer", str(model_dir),
        "--endpoint", "completions", "--isl", str(ISL), "--osl", str(OSL), "--conc", "1,4",
        "--requests", str(REQUESTS), "--warmup", "1", "--timeout", "60", "--quiet",
        "--no-plots", "--out", str(out)])
    assert "Traceback" not in result.output, result.output
    assert result.exit_code == 0, result.output
    req = pd.read_parquet(out / "requests.parquet")
    return req[~req["warmup"]]


def assert_clean_and_exact(req: pd.DataFrame) -> None:
    assert len(req) == 2 * REQUESTS
    errors = req.loc[~req["ok"], ["error_kind", "error_message"]]
    assert errors.empty, errors.to_string()
    # the server's own counts (usage in the stream): within 2% of the requested lengths
    assert (req["input_tokens_source"] == "usage").all()
    assert (abs(req["input_tokens"] - ISL) <= 0.02 * ISL).all(), req["input_tokens"].tolist()
    assert (abs(req["output_tokens"] - OSL) <= 0.02 * OSL).all(), req["output_tokens"].tolist()


def assert_one_token_per_chunk(req: pd.DataFrame) -> None:
    """The mockers emit only ids of the served tokenizer's vocabulary (`--tokenizer`): an
    out-of-vocabulary id, or one that decodes alone to part of a UTF-8 character, detokenizes
    to nothing, so Dynamo merges it into the next chunk."""
    assert (req["tokens_per_chunk"] == 1.0).all(), req["tokens_per_chunk"].describe()


def recorded(proc: Proc) -> list[generation_pb2.GenerateRequest]:
    with grpc.insecure_channel(proc.address) as channel:
        return list_recorded(channel)


def is_context_only(r: generation_pb2.GenerateRequest) -> bool:
    v = r.extra.fields.get(wc.REQUEST_TYPE_KEY) if r.HasField("extra") else None
    return v is not None and v.string_value == wc.CONTEXT_ONLY


def test_aggregated(dynamo: Callable[..., Stack], model_dir: Path, tmp_path: Path) -> None:
    stack = dynamo(False)
    req = sweep_through(stack, model_dir, tmp_path / "agg")
    assert_clean_and_exact(req)
    seen = recorded(stack.engines["aggregated"])
    assert seen and not any(is_context_only(r) or r.kv.HasField("session") for r in seen)
    assert_one_token_per_chunk(req)


def test_disaggregated_legs_on_distinct_workers(dynamo: Callable[..., Stack], model_dir: Path,
                                                tmp_path: Path) -> None:
    stack = dynamo(True)
    req = sweep_through(stack, model_dir, tmp_path / "disagg")
    assert_clean_and_exact(req)
    prefill, decode = recorded(stack.engines["prefill"]), recorded(stack.engines["decode"])
    # every measured request's context leg went to the prefill mocker (max_tokens 1) and its
    # generation leg, with the handed-off kv.session, to the decode mocker
    assert len(prefill) >= len(req) and all(is_context_only(r) for r in prefill)
    assert all(r.stopping.max_tokens == 1 for r in prefill)
    assert len(decode) >= len(req) and all(r.kv.HasField("session") for r in decode)
    assert_one_token_per_chunk(req)


def test_cancel_through_dynamo_leaves_the_mockers_idle(
        dynamo: Callable[..., Stack], model_dir: Path, tmp_path: Path) -> None:
    """The lab's client cancels through Dynamo's frontend (closing the connection after the
    third token); Dynamo's frontend and sidecar must pass it on, so that the mockers end with
    nothing running or queued, no KV block used and no Generate stream open. The sweep itself
    says that it cannot check inside a --target."""
    stack = dynamo(False, "--speedup-ratio", "1", "--engine-args",
                   '{"timing": {"type": "fixed", "prefill_ms": 5, "decode_ms": 10}}')
    out = tmp_path / "cancel"
    result = CliRunner().invoke(sweep, [
        "--target", stack.url, "--model", stack.model, "--tokenizer", str(model_dir),
        "--endpoint", "completions", "--isl", str(ISL), "--osl", "1000", "--conc", "4",
        "--requests", "4", "--warmup", "0", "--timeout", "60", "--no-plots",
        "--cancel", "1", "--cancel-after", "3tok", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"c=4: {TARGET_NOTE}" in result.output, result.output
    req = pd.read_parquet(out / "requests.parquet")
    assert req["cancelled"].all() and req["chunks"].between(3, 999).all(), req["chunks"]
    assert pd.read_csv(out / "levels.csv").loc[0, "cancelled"] == 4
    address = stack.engines["aggregated"].address

    def idle() -> bool:
        load = engine_load(address, 5.0)
        return all(load.get(k) == 0 for k in ("running_requests", "queued_requests",
                                              "used_kv_blocks", "open_streams"))

    # 1000 tokens at 10 ms: a mocker Dynamo did not abort would still be busy for ~10 s
    asyncio.run(wait_for(idle, timeout=5.0, what="the mocker to be idle", interval=0.1,
                         in_thread=True))
