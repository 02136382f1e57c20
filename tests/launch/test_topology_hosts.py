"""Hosts in a topology file: parsing, round trip, errors with key and line, placement argv.

No namespaces are created here (check_system=False, or a faked capability answer).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from launch import netns
from launch.commands import Programs
from launch.errors import TopologyError
from launch.events import EventLog
from launch.linkshape import LinkShape
from launch.placement import Placement
from launch.supervisor import Supervisor
from launch.topology import TopologySpec

HOSTS = """\
name = "h"
frontend_host = "fe"

[[fleet]]
role = "prefill"
host = "gpu1"

[[fleet]]
role = "decode"

[hosts.fe]
[hosts.gpu1]
rate = "1gbit"
burst = "64kb"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "t.toml"
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(TopologyError) as info:
        TopologySpec.from_toml(path, check_system=False)
    return str(info.value).replace(str(path), "FILE")


def test_hosts_parse_and_round_trip(tmp_path: Path) -> None:
    spec = TopologySpec.from_toml(write(tmp_path, HOSTS), check_system=False)
    assert spec.frontend_host == "fe"
    assert [f.host for f in spec.fleets] == ["gpu1", None]
    assert spec.hosts == {"fe": {}, "gpu1": {"rate": "1gbit", "burst": "64kb"}}
    assert spec.link_shapes() == {"fe": LinkShape(),
                                  "gpu1": LinkShape(rate_bps=10**9, burst_bytes=65536)}
    again = TopologySpec.from_dict(spec.to_dict())
    assert again == spec
    # without hosts nothing changes
    plain = TopologySpec.from_toml(write(tmp_path, 'name = "p"\n'))
    assert plain.hosts == {} and plain.frontend_host is None and plain.fleets[0].host is None


@pytest.mark.parametrize(("text", "expected"), [
    (HOSTS.replace('host = "gpu1"', 'host = "gpu9"'),
     "FILE:6: fleet[0].host: 'gpu9': unknown host (hosts: fe, gpu1)"),
    (HOSTS.replace('frontend_host = "fe"', 'frontend_host = "nope"'),
     "FILE:2: frontend_host: 'nope': unknown host (hosts: fe, gpu1)"),
    ('[[fleet]]\nrole = "aggregated"\nhost = "a"\n',
     "FILE:3: fleet[0].host: 'a': unknown host (hosts: none declared; add a [hosts.NAME] table)"),
    (HOSTS.replace('rate = "1gbit"', 'rate = "1gbps"'),
     "FILE:13: hosts.gpu1.rate = '1gbps': use bit units"),
    (HOSTS.replace('burst = "64kb"', 'speed = 3'),
     "FILE:14: hosts.gpu1.speed: unknown key (known: rate, burst, queue, delay, jitter, loss)"),
    (HOSTS.replace("[hosts.fe]", "[hosts.Fe]").replace('"fe"', '"Fe"'),
     "FILE:11: hosts.Fe: a host name is 1-32 of a-z 0-9 _ -"),
    ('[hosts.x]\njitter = "1ms"\n', "FILE:2: hosts.x.jitter: needs a delay on the same host"),
])
def test_host_errors_name_key_and_line(tmp_path: Path, text: str, expected: str) -> None:
    assert error_of(tmp_path, text).startswith(expected)


def test_system_check_at_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, HOSTS)
    monkeypatch.setitem(netns._cache, "available", (False, "network namespaces need root"))
    with pytest.raises(TopologyError, match="cannot create network namespaces: network "
                       "namespaces need root"):
        TopologySpec.from_toml(path)
    monkeypatch.setitem(netns._cache, "available", (True, ""))
    monkeypatch.setitem(netns._cache, "qdisc:tbf", (True, ""))
    monkeypatch.setitem(netns._cache, "qdisc:netem", (False, "unknown qdisc"))
    TopologySpec.from_toml(path)  # a rate alone is fine without netem
    path.write_text(HOSTS.replace('burst = "64kb"', 'loss = "1%"'))
    with pytest.raises(TopologyError) as info:
        TopologySpec.from_toml(path)
    assert str(info.value).startswith(f"{path}:14: hosts.gpu1: loss requested")
    assert netns.NO_NETEM in str(info.value)


def test_placed_processes_run_in_their_host_and_bind_its_address(tmp_path: Path) -> None:
    spec = TopologySpec.from_toml(write(tmp_path, HOSTS), check_system=False)
    place = Placement(
        prefixes={"fe": ["ip", "netns", "exec", "ns-fe"], "gpu1": ["ip", "netns", "exec", "ns-g"]},
        addresses={"fe": "10.213.7.2", "gpu1": "10.213.7.3"},
        gateway="10.213.7.1",
    )
    events = EventLog(tmp_path / "events.jsonl")
    sup = Supervisor(spec, tmp_path, events, "file:/d", programs=Programs(["M"], ["L"]),
                     placement=place)
    engine = sup.get("engine-prefill-0")
    argv = engine.argv_fn(engine)
    assert argv[:6] == ["ip", "netns", "exec", "ns-g", "M", "serve"]
    assert argv[argv.index("--listen") + 1] == "10.213.7.3:0"
    engine.last_address = "10.213.7.3:4000"
    sidecar = sup.get("sidecar-prefill-0")
    argv = sidecar.argv_fn(sidecar)
    assert argv[:5] == ["ip", "netns", "exec", "ns-g", "L"]
    assert argv[argv.index("--listen") + 1] == "10.213.7.3:0"
    assert argv[argv.index("--engine") + 1] == "10.213.7.3:4000"
    # a fleet left in the root namespace: engine on loopback, sidecar on the bridge address
    # (the frontend inside host fe must reach it)
    engine = sup.get("engine-decode-0")
    argv = engine.argv_fn(engine)
    assert argv[:2] == ["M", "serve"] and argv[argv.index("--listen") + 1] == "127.0.0.1:0"
    engine.last_address = "127.0.0.1:5000"
    sidecar = sup.get("sidecar-decode-0")
    argv = sidecar.argv_fn(sidecar)
    assert argv[0] == "L" and argv[argv.index("--listen") + 1] == "10.213.7.1:0"
    argv = sup.frontend.argv_fn(sup.frontend)
    assert argv[:5] == ["ip", "netns", "exec", "ns-fe", "L"]
    assert argv[argv.index("--listen") + 1] == "10.213.7.2:0"
    assert [p.host for p in sup.processes] == ["gpu1", None, "gpu1", None, "fe"]
    events.close()
