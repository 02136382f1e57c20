"""`mocker serve` / `mocker bench` command lines: help, defaults, bad values exit 2 naming the
option (never a traceback), engine args from a file."""

from __future__ import annotations

import json
import subprocess
import sys

import grpc
from click.testing import CliRunner

from lab.wire.gen.openengine.v1 import openengine_pb2_grpc, server_pb2
from mocker.cli import main
from tests.mocker.test_server_support import mocker_argv
from tests.usage_errors import assert_usage_error, usage_cases


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_serve_help_explains_every_option_and_its_default():
    result = run("serve", "--help")
    assert result.exit_code == 0
    text = "".join(result.output.split())  # click wraps lines (even at hyphens)
    for option, default in [
        ("--listen", "127.0.0.1:50051"),
        ("--role", "aggregated"),
        ("--model", "mocker-model"),
        ("--seed", "42"),
        ("--context-length", "32768"),
        ("--max-concurrent-requests", "256"),
        ("--speedup-ratio", "1"),
        ("--decode-speedup-ratio", "1"),
        ("--engine-args", "TRT-LLM defaults"),
        ("--kv-host", "127.0.0.1"),
        ("--kv-port", "5600"),
        ("--instance-id", "dynamo-trtllm-mocker-<role>"),
        ("--record-requests", "no-record-requests"),
        ("--stall-timeout", "30"),
        ("--grace", "5"),
        ("--tokenizer", "ids in [1000, 31999]"),
        ("--vocab-size", "ids in [1000, 31999]"),
    ]:
        assert option in text, option
        assert "".join(default.split()) in text, (option, default)
    assert run("bench", "--help").exit_code == 0


@usage_cases(
    "--context-length 0",
    "--context-length abc",
    "--max-concurrent-requests 0",
    "--engine-args '{not json'",
    """--engine-args '{"no_such_arg": 1}'""",
    """--engine-args '{"block_size": 1}'""",
    "--engine-args /nonexistent/engine.json",
    "--listen nonsense",
    "--listen 127.0.0.1:70000",
    "--role encode",
    "--role prefill --kv-port 0",
    "--kv-port -1",
    "--speedup-ratio -1",
    "--decode-speedup-ratio nan",
    "--seed -1",
    "--model ''",
    "--stall-timeout 0",
    "--vocab-size 0",
    ("--tokenizer /nonexistent/tok", "--tokenizer"),
    ("--tokenizer /nonexistent/tok --vocab-size 5", "--tokenizer"),
)
def test_bad_serve_options_exit_2_naming_the_option(args, named):
    result = run("serve", *args)
    assert_usage_error(result.exit_code, result.output, named)
    if "no_such_arg" in " ".join(args):
        assert "no_such_arg" in result.output


def test_a_bad_option_in_a_real_process_exits_2_without_a_traceback():
    proc = subprocess.run(
        [sys.executable, *mocker_argv("--context-length", "0")[1:]],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--context-length" in proc.stderr and "Traceback" not in proc.stderr


def test_engine_args_come_from_a_file(spawn, tmp_path):
    path = tmp_path / "engine.json"
    path.write_text(json.dumps({"num_gpu_blocks": 100, "max_num_seqs": 7}))
    proc = spawn("engine-file", mocker_argv("--engine-args", str(path), "--speedup-ratio", "0"))
    with grpc.insecure_channel(proc.address) as ch:
        info = openengine_pb2_grpc.ControlStub(ch).GetServerInfo(
            server_pb2.GetServerInfoRequest(), timeout=10
        )
    assert info.capacity.total_kv_blocks == 100
    assert info.capacity.max_running_requests == 7
    assert info.capacity.kv_block_size == 32  # the trtllm default block size
