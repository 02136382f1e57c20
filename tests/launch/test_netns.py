"""Hosts as network namespaces (launch.netns): real namespaces, veths, a bridge, tc shaping.

Skipped with the reason when this process cannot create namespaces (not root, no `ip`);
CI runs as root and runs them.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import textwrap
import time

import pytest

from launch import netns
from launch.errors import TopologyError
from launch.linkshape import LinkShape, parse_rate

OK, REASON = netns.available()
needs_netns = pytest.mark.skipif(not OK, reason=f"needs network namespaces: {REASON}")

# A one-connection TCP server: binds HOST:0, prints the ready line, accepts one client, reads
# until EOF, answers with what it saw as JSON, exits.
SERVER = textwrap.dedent(
    """
    import json, socket, sys
    from lab.wire.ready import format_ready
    srv = socket.create_server((sys.argv[1], 0))
    print(format_ready("probe", "server", "%s:%d" % srv.getsockname()), flush=True)
    conn, peer = srv.accept()
    total = 0
    while chunk := conn.recv(1 << 16):
        total += len(chunk)
    info = {"peer": peer[0], "local": conn.getsockname()[0], "bytes": total,
            "mss": conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)}
    conn.sendall(json.dumps(info).encode())
    conn.close()
    """
)

# Connects to HOST:PORT, sends N bytes, half-closes, waits for the server's JSON answer; prints
# its own view plus the server's and the elapsed time.
CLIENT = textwrap.dedent(
    """
    import json, socket, sys, time
    host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    s = socket.create_connection((host, port), timeout=30)
    view = {"local": s.getsockname()[0], "remote": s.getpeername()[0],
            "mss": s.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)}
    t0 = time.perf_counter()
    payload = b"x" * (1 << 16)
    left = n
    while left > 0:
        left -= s.send(payload[: min(left, len(payload))])
    s.shutdown(socket.SHUT_WR)
    answer = b""
    while chunk := s.recv(1 << 16):
        answer += chunk
    elapsed = time.perf_counter() - t0
    print(json.dumps({**view, "elapsed": elapsed, "server": json.loads(answer)}))
    """
)


_serial = itertools.count()


def transfer(spawn, lab: netns.NetworkLab | None, src: str | None, dst: str, n: int) -> dict:
    """Send n bytes from host `src` (None = the root namespace) to a server in host `dst`."""
    assert lab is not None
    server = spawn(
        f"server-{dst}-{next(_serial)}",
        [*lab.exec_prefix(dst), sys.executable, "-c", SERVER, lab.address(dst)],
    )
    host, port = server.address.rsplit(":", 1)
    prefix = lab.exec_prefix(src) if src else []
    out = subprocess.run(
        [*prefix, sys.executable, "-c", CLIENT, host, port, str(n)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def names_of(run_id: str) -> list[str]:
    nss = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    return [line for line in (nss + links).splitlines() if run_id in line]


# -- no root needed ---------------------------------------------------------------------------


def test_link_shape_parsing() -> None:
    shape = LinkShape.from_config("gpu1", {"rate": "1gbit", "delay": "0.25ms", "loss": "0.1%"})
    assert shape.rate_bps == 10**9 and shape.delay_s == pytest.approx(0.00025)
    assert shape.loss_pct == pytest.approx(0.1) and shape.needs_netem
    assert parse_rate("10mbit") == 10**7 and parse_rate("500kbit") == 500_000
    assert not LinkShape.from_config("a", {"rate": "10mbit"}).needs_netem
    with pytest.raises(TopologyError, match=r"hosts\.gpu1\.rate.*bytes per second"):
        LinkShape.from_config("gpu1", {"rate": "10mbps"})
    with pytest.raises(TopologyError, match=r"hosts\.gpu1\.delay = 5: .*unit"):
        LinkShape.from_config("gpu1", {"delay": 5})
    with pytest.raises(TopologyError, match=r"hosts\.h\.jitter: needs a delay"):
        LinkShape.from_config("h", {"jitter": "1ms"})
    cmds = LinkShape(rate_bps=10**7).tc_commands("eth0")
    assert cmds == [
        ["qdisc", "replace", "dev", "eth0", "root", "handle", "1:", "tbf",
         "rate", "10000000bit", "burst", "16384", "latency", "20ms"]
    ]  # fmt: skip
    netem = LinkShape(rate_bps=10**9, delay_s=0.001, jitter_s=0.0001).tc_commands("x")
    assert netem[0][5:] == ["handle", "1:", "netem", "delay", "1000us", "100us"]
    assert netem[1][4:8] == ["parent", "1:1", "handle", "2:"]


def test_hosts_table() -> None:
    import tomllib

    from launch.linkshape import hosts_from_config

    table = tomllib.loads('[hosts.fe]\n[hosts.gpu1]\nrate = "1gbit"\nqueue = "5ms"\n')["hosts"]
    shapes = hosts_from_config(table)
    assert shapes == {"fe": LinkShape(), "gpu1": LinkShape(rate_bps=10**9, queue_s=0.005)}
    with pytest.raises(TopologyError, match=r"hosts\.gpu1\.bandwidth: unknown key"):
        hosts_from_config({"gpu1": {"bandwidth": "1gbit"}})
    with pytest.raises(TopologyError, match=r"hosts\.gpu1 = 'x': expected a table"):
        hosts_from_config({"gpu1": "x"})


def test_bad_host_names_are_refused() -> None:
    for bad in ("GPU", "a b", "-x", "x" * 40, "a/b"):
        with pytest.raises(TopologyError, match="host name"):
            netns.NetworkLab([bad])


# -- real namespaces --------------------------------------------------------------------------


@needs_netns
def test_two_hosts_talk_over_the_veth_link(spawn) -> None:
    with netns.NetworkLab(["fe", "gpu1"]) as lab:
        assert lab.subnet is not None and lab.subnet.subnet_of(netns.LAB_RANGE)
        a, b = lab.address("fe"), lab.address("gpu1")
        seen = transfer(spawn, lab, "fe", "gpu1", 100_000)
        # the sockets use the hosts' own addresses, not loopback
        assert (seen["local"], seen["remote"]) == (a, b)
        assert (seen["server"]["peer"], seen["server"]["local"]) == (a, b)
        assert seen["server"]["bytes"] == 100_000
        # a 1500-byte MTU: MSS 1448 (1460 without TCP timestamps), not loopback's ~65 KB
        assert 1400 <= seen["mss"] <= 1460, seen
        for host in lab.hosts:
            link = json.loads(
                subprocess.run(
                    ["ip", "-j", "-n", lab.namespace(host), "link", "show", "eth0"],
                    capture_output=True, text=True, check=True,
                ).stdout
            )[0]  # fmt: skip
            assert link["mtu"] == 1500
        # the launcher (root namespace) reaches a host too, from the bridge address
        from_root = transfer(spawn, lab, None, "gpu1", 1000)
        assert from_root["local"] == lab.gateway and from_root["remote"] == b


@needs_netns
def test_rate_limit_shows_in_transfer_time(spawn) -> None:
    n = 5_000_000
    shapes = {"slow": LinkShape(rate_bps=10_000_000), "fast": LinkShape(), "peer": LinkShape()}
    with netns.NetworkLab(shapes) as lab:
        shaped = transfer(spawn, lab, "peer", "slow", n)["elapsed"]
        free = transfer(spawn, lab, "peer", "fast", n)["elapsed"]
    rate = n * 8 / shaped / 1e6
    print(f"5 MB over a 10mbit tbf link: {shaped:.2f}s ({rate:.2f} Mbit/s); unshaped {free:.3f}s")
    assert shaped > 2.5, shaped  # 4 s at exactly 10 Mbit/s
    assert shaped > 4 * free


@needs_netns
def test_delay_is_refused_without_netem_or_shows_with_it(spawn) -> None:
    has_netem, reason = netns.netem_available()
    shapes = {"a": LinkShape(delay_s=0.025), "b": LinkShape()}
    if not has_netem:
        assert reason.startswith(netns.NO_NETEM)
        lab = netns.NetworkLab(shapes)
        with pytest.raises(netns.LinkShapeUnsupported) as err:
            lab.create()
        assert str(err.value) == f"hosts.a: delay requested, but {netns.NO_NETEM}"
        assert names_of(lab.run_id) == []  # refused before anything was created
        return
    with netns.NetworkLab(shapes) as lab:
        # 25 ms on each end of a's link: the request/answer exchange needs >= 2 round trips
        seen = transfer(spawn, lab, "b", "a", 10)
    assert seen["elapsed"] > 0.05, seen


@needs_netns
def test_teardown_removes_namespaces_links_and_processes(spawn) -> None:
    lab = netns.NetworkLab({"h1": LinkShape(rate_bps=10**9), "h2": LinkShape()})
    lab.create()
    try:
        assert len(names_of(lab.run_id)) == 2 + 3  # 2 namespaces, bridge + 2 veths
        sleeper = subprocess.Popen([*lab.exec_prefix("h1"), "sleep", "60"])
        time.sleep(0.2)
    finally:
        lab.destroy()
    assert sleeper.wait(5) == -9  # killed: nothing is left running inside a host
    assert names_of(lab.run_id) == []
    lab.destroy()  # idempotent


CRASHER = textwrap.dedent(
    """
    import time
    from launch.netns import NetworkLab
    from lab.wire.ready import format_ready
    lab = NetworkLab(["x", "y"])
    lab.create()
    print(format_ready("probe", lab.run_id, lab.address("x") + ":0"), flush=True)
    time.sleep(120)
    """
)


@needs_netns
def test_leftovers_of_a_crashed_run_are_found_and_cleaned(spawn) -> None:
    live = netns.NetworkLab(["alive"])  # a running launcher's hosts are never leftovers
    with live:
        crashed = spawn("crasher", [sys.executable, "-c", CRASHER])
        run_id = crashed.ready["id"]
        assert run_id not in " ".join(netns.find_leftovers().namespaces)
        crashed.signal(9)  # SIGKILL: no teardown runs
        crashed.popen.wait(5)
        found = netns.find_leftovers()
        assert sorted(n for n in found.namespaces if run_id in n) == [
            f"llab-{run_id}-x",
            f"llab-{run_id}-y",
        ]
        assert sorted(n for n in found.links if run_id in n) == [
            f"llab{run_id}br",
            f"llab{run_id}v0",
            f"llab{run_id}v1",
        ]
        assert run_id in found.runs
        assert not any(live.run_id in n for n in found.namespaces + found.links)
        netns.clean_leftovers()
        assert names_of(run_id) == []
        assert run_id not in netns.find_leftovers().runs
        assert len(names_of(live.run_id)) == 1 + 2  # the live run is untouched
    assert names_of(live.run_id) == []
