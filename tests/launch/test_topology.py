"""Topology from flags and from TOML; errors name the key and the line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from lab.shared.frontend_settings import MAX_MIGRATION_LIMIT
from lab.shared.settings import SocketSettings
from lab.wire.constants import MAX_STREAM_INTERVAL
from launch.cli import up
from launch.cli_options import spec_from_options, topology_options
from launch.errors import TopologyError
from launch.topology import DEFAULT_SPEEDUP, FleetSpec, RayPlace, TopologySpec


def parse(*args: str) -> TopologySpec:
    """Run the shared options through click, exactly as `lab up` / `lab sweep` do."""
    captured = {}

    @click.command()
    @topology_options
    def cmd(**kwargs):
        captured["spec"] = spec_from_options(**kwargs)

    result = CliRunner().invoke(cmd, list(args), catch_exceptions=False,
                                standalone_mode=False)
    del result
    return captured["spec"]


def test_defaults_come_from_one_place() -> None:
    spec = parse()
    assert [(f.role, f.count) for f in spec.fleets] == [("aggregated", 1)]
    assert spec.fleets[0].speedup == DEFAULT_SPEEDUP
    assert spec.sockets == SocketSettings()
    assert spec.frontend_port == 0 and spec.discovery is None
    assert spec.fleets[0].restart_engine == "never"
    assert spec.fleets[0].restart_sidecar == "on-failure"


def test_flags() -> None:
    spec = parse("--disagg", "--prefill", "2", "--decode", "3", "--speedup", "0",
                 "--engine-args", '{"max_num_seqs": 64}', "--decode-engine-args",
                 '{"num_gpu_blocks": 100, "max_num_seqs": 8}', "--client-nodelay", "off",
                 "--split-writes", "--pool-size", "4", "--router", "random", "--port", "0",
                 "--restart-engine", "on-failure", "--name", "exp1")
    assert [(f.role, f.count) for f in spec.fleets] == [("prefill", 2), ("decode", 3)]
    prefill, decode = spec.fleets
    assert prefill.engine_args == {"max_num_seqs": 64}
    assert decode.engine_args == {"max_num_seqs": 8, "num_gpu_blocks": 100}
    assert prefill.speedup == 0 and decode.restart_engine == "on-failure"
    assert spec.sockets == SocketSettings(client_nodelay=False, split_writes=True, pool_size=4)
    assert spec.router == "random" and spec.name == "exp1"
    assert spec.expected_workers() == {"prefill": 2, "decode": 3}


def test_engine_args_from_file(tmp_path: Path) -> None:
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"engine_type": "vllm"}))
    assert parse("--engines", "2", "--engine-args", str(path)).fleets[0].engine_args == {
        "engine_type": "vllm"}


@pytest.mark.parametrize("args,needle", [
    (["--engines", "2", "--disagg"], "--engines"),
    (["--engine-args", "{nope"], "--engine-args"),
    (["--engine-args", "/no/such/file.json"], "--engine-args"),
    (["--prefill-engine-args", "{}"], "--prefill-engine-args"),
    (["--discovery", "etcd://x"], "discovery"),
    (["--discovery", "consul://x:1"], "discovery"),
    (["--restart-engine", "sometimes"], "--restart-engine"),
])
def test_bad_flags_exit_2_naming_the_input(args: list[str], needle: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(up, [*args, "--out", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert "Traceback" not in result.output


GOOD = """\
name = "exp"
speedup = 0
engine_args = { max_num_seqs = 32 }

[sockets]
server_nodelay = false

[[fleet]]
role = "prefill"
count = 2
engine_args = { num_gpu_blocks = 512 }

[[fleet]]
role = "decode"
speedup = 10.0
restart_engine = "always"
"""


def test_toml_with_per_fleet_overrides(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text(GOOD)
    spec = TopologySpec.from_toml(path)
    assert spec.name == "exp"
    prefill, decode = spec.fleets
    assert prefill == FleetSpec("prefill", count=2, speedup=0,
                                engine_args={"max_num_seqs": 32, "num_gpu_blocks": 512})
    assert decode.speedup == 10.0 and decode.restart_engine == "always"
    assert decode.engine_args == {"max_num_seqs": 32}
    assert spec.sockets.server_nodelay is False and spec.sockets.client_nodelay is True
    # flags override the file
    over = parse("--topology", str(path), "--speedup", "5", "--name", "other")
    assert [f.speedup for f in over.fleets] == [5, 5] and over.name == "other"
    # round trip (state of a detached run)
    assert TopologySpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize("text,line,key", [
    (GOOD.replace("count = 2", "count = 2\nreplicas = 3"), 11, "fleet[0].replicas"),
    (GOOD.replace('restart_engine = "always"', 'restart_engine = "sometimes"'), 16,
     "fleet[1].restart_engine"),
    (GOOD.replace("server_nodelay = false", "server_nodelay = 1"), 6, "sockets.server_nodelay"),
    (GOOD.replace("server_nodelay = false", "nodelay = false"), 6, "sockets.nodelay"),
    (GOOD.replace("speedup = 10.0", 'speedup = "fast"'), 15, "fleet[1].speedup"),
    (GOOD.replace("speedup = 0\n", "speedup = -1\n"), 2, "speedup"),
    (GOOD.replace('name = "exp"', 'nmae = "exp"'), 1, "nmae"),
    (GOOD.replace('role = "decode"', 'role = "encode"'), 14, "fleet[1].role"),
    (GOOD.replace("count = 2", "count = 0"), 10, "fleet[0].count"),
])
def test_bad_toml_names_key_and_line(tmp_path: Path, text: str, line: int, key: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(TopologyError) as err:
        TopologySpec.from_toml(path)
    message = str(err.value)
    assert f"{path}:{line}:" in message, message
    assert key in message, message


def test_toml_syntax_error_names_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('name = "x"\n[sockets\npool_size = 2\n')
    with pytest.raises(TopologyError, match=r"line 2"):
        TopologySpec.from_toml(path)


def test_lab_up_bad_toml_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(GOOD.replace("count = 2", "count = 2\nreplicas = 3"))
    result = CliRunner().invoke(up, ["--topology", str(path), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2
    assert "bad.toml:11:" in result.output and "fleet[0].replicas" in result.output
    result = CliRunner().invoke(up, ["--topology", str(path), "--engines", "2"])
    assert result.exit_code == 2 and "--topology" in result.output


def test_discovery_specs() -> None:
    assert parse("--discovery", "etcd://127.0.0.1:2379/lab").discovery == "etcd://127.0.0.1:2379/lab"
    assert parse("--discovery", "etcd").discovery == "etcd"
    assert parse("--discovery", "file:/tmp/d").discovery == "file:/tmp/d"


def test_mixed_roles_rejected() -> None:
    with pytest.raises(TopologyError, match="prefill"):
        TopologySpec(fleets=[FleetSpec("aggregated"), FleetSpec("prefill")]).validate()
    with pytest.raises(TopologyError, match="decode fleet"):
        TopologySpec(fleets=[FleetSpec("prefill")]).validate()


def test_out_must_be_empty(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("")
    result = CliRunner().invoke(up, ["--out", str(tmp_path)])
    assert result.exit_code == 2 and "--out" in result.output


PLACED = ('frontend_ray_resource = "fe"\n[[fleet]]\nrole = "aggregated"\nray_resource = "gpu_a"\n'
          'ray_labels = { zone = "a" }\n')


def test_ray_placement_fields(tmp_path: Path) -> None:
    path = tmp_path / "placed.toml"
    path.write_text(PLACED)
    spec = TopologySpec.from_toml(path)
    gpu, fe = RayPlace("gpu_a", (("zone", "a"),)), RayPlace("fe")
    assert spec.ray_placement() == {"engine-0": gpu, "sidecar-0": gpu, "frontend": fe}
    assert gpu.agent == "ray-gpu_a,zone=a" and fe.agent == "ray-fe"
    assert RayPlace.of(None, {"zone": "b"}) == RayPlace(None, (("zone", "b"),))
    assert TopologySpec.from_dict(spec.to_dict()) == spec
    spec.check_ray("auto")  # placed, with --ray: fine (discovery defaults to etcd in the Stack)
    assert TopologySpec().ray_placement() == {}
    TopologySpec().check_ray(None)  # nothing placed: no Ray needed


@pytest.mark.parametrize("text,line,key", [
    (PLACED.replace('"gpu_a"', '"CPU"'), 4, "fleet[0].ray_resource"),
    (PLACED.replace('"gpu_a"', '"a b"'), 4, "fleet[0].ray_resource"),
    (PLACED.replace('"fe"', "3"), 1, "frontend_ray_resource"),
    (PLACED.replace('zone = "a"', 'zone = 1'), 5, "fleet[0].ray_labels"),
    (PLACED.replace('zone = "a"', '"a b" = "x"'), 5, "fleet[0].ray_labels"),
    ('frontend_ray_labels = "x"\n', 1, "frontend_ray_labels"),
    (PLACED.replace('ray_resource = "gpu_a"', 'ray_resource = "gpu_a"\nhost = "h"')
     + "[hosts.h]\n", 5, "fleet[0].host"),
])
def test_bad_ray_placement_names_key_and_line(tmp_path: Path, text: str, line: int,
                                              key: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(TopologyError) as err:
        TopologySpec.from_toml(path, check_system=False)
    assert f"{path}:{line}:" in str(err.value) and key in str(err.value), str(err.value)


@pytest.mark.parametrize("change,address,needle", [
    ({}, None, "pass --ray ADDRESS|auto"),
    ({"discovery": "file:/tmp/d"}, "auto", "through etcd"),
    ({"hosts": {"h": {}}}, "auto", "cannot be combined"),
])
def test_check_ray_refuses(tmp_path: Path, change: dict, address: str | None,
                           needle: str) -> None:
    path = tmp_path / "placed.toml"
    path.write_text(PLACED)
    spec = dataclasses.replace(TopologySpec.from_toml(path), **change)
    with pytest.raises(TopologyError, match=needle):
        spec.check_ray(address)


def test_lab_up_ray_needs_a_placed_topology(tmp_path: Path) -> None:
    result = CliRunner().invoke(up, ["--ray", "auto", "--out", str(tmp_path / "r")])
    assert result.exit_code == 2 and "places nothing on Ray" in result.output, result.output


@pytest.mark.parametrize("first,key", [
    (f"migration_limit = {MAX_MIGRATION_LIMIT + 1}", "migration_limit"),
    (f"stream_interval = {MAX_STREAM_INTERVAL + 1}", "stream_interval"),
    ("stream_interval = 0", "stream_interval"),
    ('count = "2"', "count"),
    ("enforce_disagg = 1", "enforce_disagg"),
    ("frontend_port = 70000", "frontend_port"),
    ('router = "fastest"', "router"),
    ("ready_timeout_s = 0.01", "ready_timeout_s"),
])
def test_a_file_value_is_checked_by_the_settings_field(tmp_path: Path, first: str,
                                                         key: str) -> None:
    """A topology file's value is refused by the same field (bounds, type, choices) as the
    process's flag, naming the key and its line; no bound of its own (the migration bound is
    the frontend's MAX_MIGRATION_LIMIT, the stream interval the engine's)."""
    path = tmp_path / "bad.toml"
    if key == "count":
        path.write_text(GOOD.replace("count = 2", first))
        line, key = 10, "fleet[0].count"
    else:
        path.write_text(f"{first}\n{GOOD}")
        line = 1
    with pytest.raises(TopologyError) as err:
        TopologySpec.from_toml(path)
    assert f"{path}:{line}: {key}: " in str(err.value), str(err.value)


def test_a_file_value_at_the_fields_bound_loads(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text(f"migration_limit = {MAX_MIGRATION_LIMIT}\n"
                    f"stream_interval = {MAX_STREAM_INTERVAL}\n{GOOD}")
    spec = TopologySpec.from_toml(path)
    assert spec.migration_limit == MAX_MIGRATION_LIMIT
    assert {f.stream_interval for f in spec.fleets} == {MAX_STREAM_INTERVAL}


def test_a_flag_the_spec_refuses_names_the_flag(tmp_path: Path) -> None:
    """--discovery passes its option's type, then the spec's field refuses it: the usage error
    names the flag (no table of field -> flag: the option is the field of the same name)."""
    result = CliRunner().invoke(up, ["--discovery", "consul://x:1", "--out",
                                     str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--discovery'" in result.output, result.output
    assert "consul://x:1" in result.output
