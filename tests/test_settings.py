"""Every setting is defined once (lab.shared.config_cli): each process's command line is generated
from its settings model, and so is the launcher's argv. These tests parse the generated argv with
the real click commands and check that what arrives is what was meant."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from lab.serve.frontend.cli import frontend
from lab.serve.sidecar.cli import sidecar
from lab.shared.config_cli import Settings, option_names, parse_settings
from lab.shared.engine_settings import ENGINE_SPEEDUP_DEFAULT_TEXT, EngineSettings
from lab.shared.frontend_settings import FrontendSettings
from lab.shared.sidecar_settings import SidecarSettings
from launch.cli_options import spec_from_options, topology_options
from launch.commands import (
    Programs,
    engine_argv,
    engine_settings,
    frontend_argv,
    frontend_settings,
    sidecar_argv,
    sidecar_settings,
)
from launch.topology import FleetSpec, TopologySpec
from mocker.cli import main as mocker_main
from mocker.engine import EngineArgs
from tests.usage_errors import assert_usage_error, usage_cases

COMMANDS: dict[type[Settings], click.Command] = {
    EngineSettings: mocker_main.commands["serve"],  # type: ignore[attr-defined]
    SidecarSettings: sidecar,
    FrontendSettings: frontend,
}
NO_PROGRAMS = Programs(mocker=[], lab=[])


def parsed(model: type[Settings], argv: list[str]) -> Settings:
    """What the real command makes of `argv` (its options parsed, its body not run)."""
    command = COMMANDS[model]
    with command.make_context(command.name or "cmd", list(argv)) as ctx:
        return parse_settings(model, ctx.params)


def every_field_changed(tmp_path: Path) -> dict[type[Settings], dict[str, Any]]:
    """For each model, a value other than the default for every field."""
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text("{}")
    return {
        EngineSettings: dict(
            listen="127.0.0.1:50999", admin_listen="127.0.0.1:0", role="prefill",
            model="m-2", seed=7, tokenizer=str(tokenizer), vocab_size=4096,
            context_length=4096, max_concurrent_requests=9,
            speedup_ratio=250.5, decode_speedup_ratio=2.25, engine_args='{"max_num_seqs":3}',
            kv_host="127.0.0.2", kv_port=5601, instance_id="engine-0-abcd",
            record_requests=True, stall_timeout=12.5, stream_interval=8, run_ahead=16,
            grace=1.5, log_level="debug",
        ),
        SidecarSettings: dict(
            engine="127.0.0.1:50051", listen="127.0.0.1:7001", discovery="file:/tmp/disc",
            worker_id="sidecar-3", server_nodelay=False, grace_period=1.5,
            inflight_timeout=3.5, startup_deadline=9.0, connect_attempt_timeout=4.0,
            retry_interval=0.5, heartbeat=0.25, ttl=3.0, stale_load=7.0, stall=0.75,
            probe_timeout=1.25, keepalive=2.5, keepalive_timeout=3.5, log_level="warning",
        ),
        FrontendSettings: dict(
            listen="127.0.0.1:8123", discovery="etcd://127.0.0.1:2379/x", discovery_ttl=3.5,
            router="least-loaded", client_nodelay=False, split_writes=True, pool_size=5,
            http_nodelay=False, enforce_disagg=True, migration_limit=3,
            expect={"prefill": 2, "decode": 1}, tokenizer=str(tokenizer), model_name="m-3",
            max_body_bytes=1000, idle_timeout=2.5, body_timeout=1.5, max_connections=10,
            shutdown_grace=0.5, debug_endpoints=True, log_level="error", reasoning_parser="think",
            add_special_tokens=True,
        ),
    }


@pytest.mark.parametrize("model", list(COMMANDS), ids=lambda m: m.__name__)
def test_every_field_reaches_its_process(model: type[Settings], tmp_path: Path) -> None:
    values = every_field_changed(tmp_path)[model]
    assert set(values) == set(model.model_fields), "give every field a non-default value"
    for name, value in values.items():
        assert value != model.model_fields[name].default, name
    meant = model(**values)
    assert parsed(model, meant.to_argv()) == meant


@pytest.mark.parametrize("model", list(COMMANDS), ids=lambda m: m.__name__)
def test_no_flags_mean_the_defaults(model: type[Settings]) -> None:
    required = {"engine": "127.0.0.1:1", "discovery": "file:/tmp/d"}
    given = {k: v for k, v in required.items() if k in model.model_fields}
    assert parsed(model, model(**given).to_argv()) == model(**given)
    assert len(model(**given).to_argv()) == 2 * len(given)  # only what was set is passed


def _topologies(tmp_path: Path) -> list[TopologySpec]:
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text("{}")
    disagg = TopologySpec.disaggregated(
        prefill=2, decode=1, speedup=250.0, decode_speedup=3.0, stream_interval=4,
        engine_args={"max_num_seqs": 8}, migration_limit=0, enforce_disagg=True,
        router="random", model="m-4", frontend_port=8555, tokenizer=str(tokenizer),
        add_special_tokens=True,
    )
    disagg.sockets = type(disagg.sockets)(client_nodelay=False, server_nodelay=False,
                                          split_writes=True, pool_size=7, http_nodelay=False)
    return [TopologySpec(), disagg]


def test_the_launchers_argv_is_what_each_process_parses(tmp_path: Path) -> None:
    for spec in _topologies(tmp_path):
        for fleet in spec.fleets:
            meant_e = engine_settings(spec, fleet, "engine-0-abcd", port=50123)
            argv = engine_argv(NO_PROGRAMS, spec, fleet, "engine-0-abcd", port=50123)
            assert argv[0] == "serve"
            assert parsed(EngineSettings, argv[1:]) == meant_e
            assert (meant_e.role, meant_e.speedup_ratio, meant_e.stream_interval) == (
                fleet.role, fleet.speedup, fleet.stream_interval)

            meant_s = sidecar_settings(spec, "127.0.0.1:50123", "file:/tmp/d", "sidecar-0")
            argv = sidecar_argv(NO_PROGRAMS, spec, fleet, "127.0.0.1:50123", "file:/tmp/d",
                                "sidecar-0")
            assert argv[0] == "sidecar"
            assert parsed(SidecarSettings, argv[1:]) == meant_s
            assert meant_s.server_nodelay == spec.sockets.server_nodelay

        meant_f = frontend_settings(spec, "file:/tmp/d")
        argv = frontend_argv(NO_PROGRAMS, spec, "file:/tmp/d")
        assert argv[0] == "frontend"
        got = parsed(FrontendSettings, argv[1:])
        assert got == meant_f
        assert (got.migration_limit, got.enforce_disagg, got.split_writes, got.pool_size,
                got.expect, got.add_special_tokens) == (
                    spec.migration_limit, spec.enforce_disagg, spec.sockets.split_writes,
                    spec.sockets.pool_size, spec.expected_workers(), spec.add_special_tokens)


def test_extra_args_follow_the_generated_flags() -> None:
    spec = TopologySpec(fleets=[FleetSpec("aggregated", extra_sidecar_args=["--stall", "5"])])
    argv = sidecar_argv(NO_PROGRAMS, spec, spec.fleets[0], "127.0.0.1:1", "file:/d", "s-0")
    assert parsed(SidecarSettings, argv[1:]).stall == 5.0


def test_the_engine_speedup_default_shown_is_the_engine_args_default() -> None:
    defaults = EngineArgs()
    assert f"{defaults.speedup_ratio:g}" == ENGINE_SPEEDUP_DEFAULT_TEXT
    assert f"{defaults.decode_speedup_ratio:g}" == ENGINE_SPEEDUP_DEFAULT_TEXT


def test_log_levels_are_the_same_words_everywhere() -> None:
    for model in COMMANDS:
        assert model.model_fields["log_level"].default == "info"
        assert parsed(model, [*_required(model), "--log-level", "DEBUG"]).log_level == "debug"


def _required(model: type[Settings]) -> list[str]:
    return {
        EngineSettings: [],
        SidecarSettings: ["--engine", "127.0.0.1:1", "--discovery", "file:/tmp/d"],
        FrontendSettings: ["--discovery", "file:/tmp/d"],
    }[model]


@usage_cases(
    "serve --stall-timeout nan",
    "serve --grace inf",
    "serve --speedup-ratio inf",
    ("serve --role decode --kv-port 0", "--kv-port"),
)
def test_bad_engine_values_exit_2_naming_the_option(args: list[str], named: str) -> None:
    result = CliRunner().invoke(mocker_main, args)
    assert_usage_error(result.exit_code, result.output, named)


@usage_cases(
    "--stall nan",
    "--heartbeat inf",
    "--stall 0",
    ("--ttl 1 --heartbeat 1", "--ttl"),
    "--worker-id ../x",
    "--engine nonsense",
    "--discovery nope",
    "--discovery etcd://",
)
def test_bad_sidecar_values_exit_2_naming_the_option(args: list[str], named: str) -> None:
    base = ["--engine", "127.0.0.1:1", "--discovery", "file:/tmp/d"]
    result = CliRunner().invoke(sidecar, [*base, *args])
    assert_usage_error(result.exit_code, result.output, named)


@usage_cases(
    "--idle-timeout nan",
    "--discovery-ttl inf",
    "--expect prefill",
    "--tokenizer /nonexistent/tokenizer.json",
    "--listen nonsense",
)
def test_bad_frontend_values_exit_2_naming_the_option(args: list[str], named: str) -> None:
    result = CliRunner().invoke(frontend, ["--discovery", "file:/tmp/d", *args])
    assert_usage_error(result.exit_code, result.output, named)


@usage_cases(
    "--speedup nan",
    "--decode-speedup inf",
    "--stream-interval 0",
    "--migration-limit 1001",
)
def test_the_topology_options_share_the_fields_bounds(args: list[str], named: str) -> None:
    @click.command()
    @topology_options
    def cmd(**kwargs: Any) -> None:
        spec_from_options(**kwargs)

    result = CliRunner().invoke(cmd, args)
    assert_usage_error(result.exit_code, result.output, named)


def test_a_run_value_is_in_the_model_but_no_option() -> None:
    """The load client runs on ClientSettings itself: what a sweep fills in per level
    (duration_s, request_id_prefix, start_at_ns, http_nodelay) is a field, but no option of
    `lab sweep` and never in an argv; the options are still parsed into the same model."""
    from lab.commands.sweep import sweep
    from lab.load.client_settings import ClientSettings

    run_values = {"duration_s", "request_id_prefix", "start_at_ns", "http_nodelay"}
    assert run_values <= set(ClientSettings.model_fields)
    assert run_values.isdisjoint(option_names(ClientSettings))
    flags = {opt for p in sweep.params for opt in p.opts}
    assert not {"--duration-s", "--request-id-prefix", "--start-at-ns"} & flags
    per_level = ClientSettings(timeout=5.0).model_copy(
        update=dict(duration_s=1.5, request_id_prefix="c1-", start_at_ns=7))
    assert per_level.to_argv() == ["--timeout", "5.0"]
    with sweep.make_context("sweep", ["--timeout", "5", "--client-procs", "2"]) as ctx:
        parsed = parse_settings(ClientSettings, ctx.params)
    assert (parsed.timeout, parsed.client_procs, parsed.duration_s) == (5.0, 2, None)
    assert parsed.http_nodelay is True  # the topology's --http-nodelay is not the client's


def test_a_sweep_runs_its_client_in_a_child_process_unless_asked(tmp_path: Path) -> None:
    """The client's CPU and loop-lag figures are its own only in a process of its own."""
    lab = str(Path(sys.executable).parent / "lab")
    for extra, isolated in (([], True), (["--in-process-client"], False)):
        out = tmp_path / f"run-{isolated}"
        proc = subprocess.run(
            [lab, "sweep", "--conc", "1", "--requests", "4",
             "--warmup", "0", "--osl", "4", "--isl", "8", "--speedup", "0", "--no-plots",
             "--quiet", "--out", str(out), *extra],
            capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        config = json.loads((out / "config.json").read_text())
        assert config["sweep"]["client"]["in_process_client"] is not isolated, \
            config["sweep"]["client"]


# --- the commands that launch or drive the processes: `lab sweep`, `lab up`, `lab nagle` ---

def _command_models() -> dict[type[Settings], click.Command]:
    from lab.commands.discovery_bench import DiscoveryBenchSettings, bench_discovery
    from lab.commands.sweep import sweep
    from lab.load.client_settings import ClientSettings
    from lab.nagle.command import nagle
    from lab.nagle.settings import NagleSettings
    from lab.open_loop.arrival_settings import ArrivalSettings
    from lab.sweep.shard import ShardSettings
    from lab.sweep.sweep_settings import SweepSettings
    from launch.cli import UpSettings, up
    from launch.topology_settings import TopologySettings

    return {SweepSettings: sweep, ClientSettings: sweep, ArrivalSettings: sweep,
            ShardSettings: sweep, TopologySettings: up, UpSettings: up, NagleSettings: nagle,
            DiscoveryBenchSettings: bench_discovery}


def command_values(tmp_path: Path) -> dict[str, list[dict[str, Any]]]:
    """Per model (by name), instances whose fields together take a non-default value each
    (more than one where a cross-field check forbids setting every field at once)."""
    import os

    from lab.sweep.sweep_settings import FaultSpec

    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text("{}")
    toml = tmp_path / "topology.toml"
    toml.write_text("")
    earlier = tmp_path / "earlier-run"
    earlier.mkdir()
    return {
        "SweepSettings": [dict(
            conc=(2, 8), isl=64, osl=16, isl_stddev=4.0, osl_stddev=2.0, requests=40, warmup=3,
            repeat=2, seed=9, shared_prefix=8, prompt_kind="text", endpoint="chat",
            out=tmp_path / "sweep", target="http://127.0.0.1:1",
            server_pids={"frontend": os.getpid()}, slo_ttft_ms=100.0, slo_latency_ms=900.0,
            slo_itl_ms=5.5, knee_threshold=0.25, compare_disagg=True,
            faults=(FaultSpec("engine-0", "kill", 1.5),), no_plots=True, quiet=True,
            slo_share=0.95, max_levels=5, ramp_up=1.5),
            dict(duration=2.5), dict(conc="auto", slo_ttft_ms=50.0)],
        "ClientSettings": [dict(client_procs=3, fresh_connection=True, in_process_client=True,
                                gap_ms=2.5, timeout=30.0, cancel=0.25, cancel_after="8tok",
                                cancel_seed=5),
                           dict(client_realtime=True)],  # not with in_process_client
        "ArrivalSettings": [dict(rate=(5.0, 10.0), arrival="gamma:2", max_concurrency=16),
                            dict(rate="auto")],
        "ShardSettings": [dict(shard="1/4", barrier="etcd://127.0.0.1:2379/job-1",
                               barrier_timeout=30.0)],
        "TopologySettings": [dict(
            topology=toml, engines=3, disagg=True, prefill=2, decode=2, speedup=250.5,
            decode_speedup=2.5, stream_interval=4, engine_args='{"max_num_seqs":3}',
            prefill_engine_args='{"max_num_seqs":4}', decode_engine_args='{"max_num_seqs":5}',
            router="random", client_nodelay=False, server_nodelay=True, split_writes=False,
            pool_size=5, http_nodelay=False, frontend_port=8123, discovery="etcd",
            restart_engine="on-failure", restart_sidecar="never", model="m-5",
            tokenizer=str(tokenizer), migration_limit=3, enforce_disagg=False, name="n-1",
            add_special_tokens=True,
            ready_timeout_s=12.5, grace_s=0.5)],
        "UpSettings": [dict(out=tmp_path / "up", detach=True, supervise=tmp_path / "sup",
                            ray="127.0.0.1:6379")],
        "NagleSettings": [dict(
            out=tmp_path / "nagle", requests=50, arms="control,suspect", gap_ms="5,10", many=8,
            threshold_ms=12.5, speedup=250.0, isl=16, osl=8, seed=3, warmup=2, timeout_s=30.0,
            endpoint="chat", prompt_kind="text", tokenizer=str(tokenizer),
            target="http://127.0.0.1:1", model="m", topology=toml, reanalyse_dir=earlier)],
        "DiscoveryBenchSettings": [dict(workers=(5, 50), events=20)],
    }


@pytest.mark.parametrize("model", list(_command_models()), ids=lambda m: m.__name__)
def test_every_command_field_reaches_its_command(model: type[Settings], tmp_path: Path) -> None:
    """`lab sweep` (its own, the client's, the arrival's, the shard's and the topology's
    settings), `lab up` and `lab nagle`: the flags `to_argv()` writes are what the real
    command parses, for every field."""
    command = _command_models()[model]
    instances = command_values(tmp_path)[model.__name__]
    given = {name for values in instances for name in values}
    assert given == set(option_names(model)), "give every option a non-default value"
    for values in instances:
        for name, value in values.items():
            assert value != model.model_fields[name].default, name
        meant = model(**values)
        with command.make_context(command.name or "cmd", meant.to_argv()) as ctx:
            assert parse_settings(model, ctx.params) == meant


def test_up_options_reach_the_spec_and_each_process(tmp_path: Path) -> None:
    """A topology flag of `lab up` reaches the launcher's spec, and from it the argv of the
    process whose setting it is (--stream-interval: the engine; --migration-limit: the
    frontend; --server-nodelay: the sidecar)."""
    from launch.cli import up
    from launch.topology_settings import TopologySettings

    meant = TopologySettings(stream_interval=6, migration_limit=4, server_nodelay=False,
                             speedup=125.0, pool_size=3)
    with up.make_context("up", meant.to_argv()) as ctx:
        spec = spec_from_options(**ctx.params)
    fleet = spec.fleets[0]
    engine = parsed(EngineSettings, engine_argv(NO_PROGRAMS, spec, fleet, "e-0", port=1)[1:])
    sidecar_got = parsed(SidecarSettings,
                         sidecar_argv(NO_PROGRAMS, spec, fleet, "127.0.0.1:1", "file:/d",
                                      "s-0")[1:])
    frontend_got = parsed(FrontendSettings, frontend_argv(NO_PROGRAMS, spec, "file:/d")[1:])
    assert (engine.stream_interval, engine.speedup_ratio) == (6, 125.0)
    assert sidecar_got.server_nodelay is False
    assert (frontend_got.migration_limit, frontend_got.pool_size) == (4, 3)
