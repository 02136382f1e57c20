"""`lab sweep` input validation, and a --target sweep against a fake OpenAI server process."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from lab.commands.sweep import parse_conc, parse_faults, parse_server_pids, sweep
from tests.procs import Proc
from tests.usage_errors import assert_usage_error, usage_cases

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake_url(spawn: Callable[..., Proc]) -> str:
    proc = spawn("fake-openai", ["python", "-m", "tests.load.fake_openai", "--port", "0"],
                 env={"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")})
    return f"http://{proc.address}"


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(sweep, list(args))
    return result.exit_code, result.output


@usage_cases(
    "--conc 1,x",
    "--conc 0,4",
    "--conc ,",
    "--requests 0",
    "--duration -1",
    "--osl 0",
    "--isl -5",
    "--warmup -1",
    "--repeat 0",
    "--client-procs 0",
    "--fault engine-0",
    "--fault engine-0:explode@1s",
    "--fault engine-9:kill@1s",
    "--fault sidecar-0:freeze@1s",
    "--target 'not a url'",
    ("--target http://127.0.0.1:9 --model m", "--target"),
    "--target http://127.0.0.1:9 --disagg",
    "--requests 5 --duration 5",
    "--conc 1,,2",
    ("--conc 1000000000", "10000"),
    ("--shared-prefix 200 --isl 100", "--shared-prefix"),
    "--slo-ttft-ms nan",
    "--slo-latency-ms inf",
    "--gap-ms nan",
    "--requests 100000000000",
    "--server-pid frontend=1",  # only with --target
    "--target http://127.0.0.1:9 --server-pid frontend",
    "--target http://127.0.0.1:9 --server-pid x=999999999",
    "--stream-interval 4097",
    "--ray-spread strict-spread",  # only with --ray
    "--ray nonsense",
    "--ray host:99999",
    ("--ray auto --client-procs 2", "--client-procs"),
    ("--ray auto --target http://127.0.0.1:9 --shard 0/2", "--shard"),
    "--ray auto --ray-client-cpus 0",
    "--ray auto --ray-clock-pings 0",
)
def test_bad_input_exits_2_naming_it(args: list[str], named: str) -> None:
    assert_usage_error(*run(*args), named)


def test_existing_run_dir(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("")
    code, out = run("--out", str(tmp_path), "--conc", "1")
    assert code == 2 and "--out" in out and "not an empty directory" in out


def test_model_not_served(fake_url: str, tmp_path: Path) -> None:
    code, out = run("--target", fake_url, "--model", "nope", "--out", str(tmp_path / "r"))
    assert code == 2 and "--model" in out and "fake-model" in out


def test_parsers() -> None:
    assert parse_conc("32, 1,1") == [1, 32]
    (f,) = parse_faults(("engine-decode-0:kill@1500ms",))
    import os

    assert parse_server_pids((f"me={os.getpid()}",)) == {"me": os.getpid()}
    assert (f.process, f.kind, f.at_s) == ("engine-decode-0", "kill", 1.5)


def test_target_sweep_writes_the_run_directory(fake_url: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    code, text = run("--target", fake_url, "--conc", "1,3", "--requests", "12", "--warmup", "2",
                     "--osl", "6", "--isl", "10", "--out", str(out), "--quiet")
    assert code == 0, text
    assert "| Conc |" in text and ("no knee" in text or "knee at" in text)
    for name in ("config.json", "requests.parquet", "levels.csv", "levels.json", "client.json",
                 "report.md", "plots/throughput.png", "plots/ttft.png"):
        assert (out / name).exists(), name
    req = pd.read_parquet(out / "requests.parquet")
    assert req.groupby("concurrency").size().to_dict() == {1: 14, 3: 14}
    assert req["ok"].all() and (req["output_tokens"] == 6).all()
    report = (out / "report.md").read_text()
    assert "server CPU is absent" in report and "external target" in report
    levels = pd.read_csv(out / "levels.csv")
    assert levels["requests"].tolist() == [12, 12] and levels["failed"].tolist() == [0, 0]


@pytest.fixture
def silent_url() -> Iterator[str]:
    """A TCP server that accepts connections and never answers (nor closes them)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                accepted.append(listener.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    listener.close()


def test_a_target_that_never_answers_names_the_wait_and_its_option(silent_url: str,
                                                                   tmp_path: Path) -> None:
    code, out = run("--target", silent_url, "--model", "m", "--timeout", "1",
                    "--out", str(tmp_path / "r"))
    assert code == 2, out
    (error,) = [line for line in out.splitlines() if line.startswith("Error:")]
    assert "'--timeout'" in error and "no answer" in error and "1 s" in error, out
    assert "TimeoutError: " not in error, out


def test_every_sweep_and_client_setting_parses_back_from_its_argv(tmp_path: Path) -> None:
    """Each field set to a value other than its default, written as argv (to_argv) and parsed
    by the real `lab sweep`: the same settings (the generated options and the models agree)."""
    from lab.load.client_settings import ClientSettings
    from lab.shared.config_cli import option_names, parse_settings
    from lab.sweep.sweep_settings import FaultSpec, SweepSettings

    given = {
        SweepSettings: SweepSettings(
            conc=(2, 5), isl=64, osl=16, isl_stddev=1.5, osl_stddev=2.5, requests=40,
            warmup=3, repeat=2, seed=9, shared_prefix=8, prompt_kind="text", endpoint="chat",
            out=tmp_path / "run", target="http://127.0.0.1:9", server_pids={"me": os.getpid()},
            slo_ttft_ms=50.0, slo_latency_ms=900.0, slo_itl_ms=5.0, knee_threshold=0.25,
            compare_disagg=True, faults=(FaultSpec("engine-0", "kill", 1.5),), no_plots=True,
            quiet=True, slo_share=0.95, max_levels=5, ramp_up=2.5),
        ClientSettings: ClientSettings(client_procs=2, fresh_connection=True,
                                       in_process_client=True, gap_ms=3.5, timeout=12.0,
                                       cancel=0.5, cancel_after="250ms", cancel_seed=3),
    }
    timed = SweepSettings(duration=5.0)  # --duration is the alternative to --requests
    realtime = ClientSettings(client_realtime=True)  # not with --in-process-client
    for model, settings in [*given.items(), (SweepSettings, timed), (ClientSettings, realtime)]:
        with sweep.make_context("sweep", settings.to_argv()) as ctx:
            assert parse_settings(model, ctx.params) == settings
    for model, settings in given.items():
        left_out = set(option_names(model)) - set(settings.model_fields_set)
        assert left_out <= {"duration", "client_realtime"}, left_out
    with sweep.make_context("sweep", []) as ctx:  # the defaults, through click
        assert parse_settings(SweepSettings, ctx.params) == SweepSettings()
        assert parse_settings(ClientSettings, ctx.params) == ClientSettings()
        assert SweepSettings().conc == (1, 32, 128, 256)
