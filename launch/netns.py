"""Hosts as Linux network namespaces on one machine, joined by a bridge, with shaped links.

One `NetworkLab` per run (names carry an 8-hex run id):

    bridge              llab<run8>br              in the root namespace, address 10.213.N.1/24
    per host i          namespace llab-<run8>-<host>, with lo up and `eth0` (10.213.N.(i+2)/24),
                        the other end of the veth pair `llab<run8>v<i>` enslaved to the bridge

Every link has MTU 1500 (like a real NIC, unlike loopback's 64 KiB). The /24 is picked inside
10.213.0.0/16, a private range that exists only inside this machine: nothing routes to it,
the namespaces get no default route, and the lab refuses to start when any route or address
outside its own links overlaps that range. Only links the lab creates are ever touched.

The launcher starts a process inside a host with `exec_prefix(host) + argv`
(`ip netns exec NAME ...`, which execs: the pid it gets is the process's own). Processes inside a
host bind and advertise `address(host)`; processes in the root namespace reach every host, and
hosts reach the root namespace at `gateway`.

Link shaping (launch.linkshape.LinkShape) applies to both ends of a host's veth, so both
directions of that link are shaped: `tbf` for the rate, `netem` for delay/jitter/loss where the
kernel has it. `netem_available()` probes once (a throwaway namespace's loopback) and caches the
answer; a shape that needs netem on a kernel without it is refused before anything is created.

Ownership and leftovers: each run writes `/run/loadlab-netns/<run8>.json` (owner pid and its
start time). `find_leftovers()` lists every `llab*` namespace and link whose run has no live
owner (the launcher crashed or was SIGKILLed); `clean_leftovers()` kills the processes still
inside those namespaces and deletes them. Runs of live launchers are never touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from launch.errors import TopologyError
from launch.linkshape import LinkShape

PREFIX = "llab"
LAB_RANGE = ipaddress.IPv4Network("10.213.0.0/16")
MTU = 1500
STATE_DIR = Path(os.environ.get("LAB_NETNS_STATE_DIR", "/run/loadlab-netns"))
MAX_HOSTS = 100  # veth names must fit IFNAMSIZ (15): llab + 8 + v + 2 digits
NO_NETEM = (
    "this kernel has no netem qdisc: link delay cannot be emulated; "
    "the lab will not fake it in user space"
)
_HOST_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
_RUN_RE = re.compile(r"[0-9a-f]{8}")


class NetnsError(RuntimeError):
    """Creating or removing namespaces/links failed; the message names the command."""


class LinkShapeUnsupported(TopologyError):
    """A topology asks for link shaping this kernel cannot do (netem missing)."""


# -- running ip / tc ------------------------------------------------------------------------------


def _run(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` failed: {proc.stderr.strip() or proc.returncode}")
    return proc


def _ip_json(*args: str) -> list[dict]:
    out = _run(["ip", "-j", *args]).stdout.strip()
    return json.loads(out) if out else []


# -- what the machine can do ----------------------------------------------------------------------

_cache: dict[str, tuple[bool, str]] = {}


@contextlib.contextmanager
def _probe_namespace() -> Iterator[str]:
    """A throwaway namespace (owned by this process, recorded like a run)."""
    run = secrets.token_hex(4)
    name = f"{PREFIX}-{run}-probe"
    _write_state(run, {"namespaces": [name], "links": []})
    try:
        _run(["ip", "netns", "add", name])
        try:
            _run(["ip", "-n", name, "link", "set", "lo", "up"])
            yield name
        finally:
            _run(["ip", "netns", "del", name], check=False)
    finally:
        _remove_state(run)


def available() -> tuple[bool, str]:
    """(True, "") when this process can create network namespaces, else (False, reason)."""
    if "available" in _cache:
        return _cache["available"]
    if os.geteuid() != 0:
        answer = (False, "network namespaces need root (run as root, as CI does)")
    elif shutil.which("ip") is None:
        answer = (False, "no `ip` binary (install iproute2)")
    elif shutil.which("tc") is None:
        answer = (False, "no `tc` binary (install iproute2)")
    else:
        try:
            with _probe_namespace():
                pass
            answer = (True, "")
        except (NetnsError, OSError) as exc:
            answer = (False, f"cannot create a network namespace: {exc}")
    _cache["available"] = answer
    return answer


def _qdisc_available(kind: list[str]) -> tuple[bool, str]:
    key = "qdisc:" + kind[0]
    if key not in _cache:
        ok, reason = available()
        if not ok:
            _cache[key] = (False, reason)
        else:
            with _probe_namespace() as ns:
                proc = _run(
                    ["tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", *kind], check=False
                )
            _cache[key] = (proc.returncode == 0, proc.stderr.strip())
    return _cache[key]


def netem_available() -> tuple[bool, str]:
    """Does the kernel have the netem qdisc? Probed once per process, on a throwaway
    namespace's loopback (no real interface is touched)."""
    ok, detail = _qdisc_available(["netem", "delay", "1ms"])
    return ok, "" if ok else f"{NO_NETEM} ({detail})" if detail else NO_NETEM


def tbf_available() -> tuple[bool, str]:
    ok, detail = _qdisc_available(["tbf", "rate", "1gbit", "burst", "64kb", "latency", "10ms"])
    return ok, "" if ok else f"this kernel has no tbf qdisc: link rates cannot be shaped ({detail})"


def check_shapes(shapes: Mapping[str, LinkShape]) -> None:
    """Refuse shapes this kernel cannot apply (LinkShapeUnsupported naming host and key).
    Call it when the topology is loaded, before anything is started."""
    for host, shape in shapes.items():
        if shape.needs_netem:
            ok, _ = netem_available()
            if not ok:
                keys = ", ".join(shape.netem_keys)
                raise LinkShapeUnsupported(f"hosts.{host}: {keys} requested, but {NO_NETEM}")
        if shape.rate_bps is not None:
            ok, reason = tbf_available()
            if not ok:
                raise LinkShapeUnsupported(f"hosts.{host}.rate: {reason}")


# -- ownership records ----------------------------------------------------------------------------


def _proc_start(pid: int) -> str | None:
    """Start time of `pid` in clock ticks since boot (field 22 of /proc/PID/stat), or None
    when it does not run (a zombie, e.g. a SIGKILLed launcher not yet reaped, is dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else fields[19]


def _write_state(run: str, data: dict) -> None:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    record = {"run": run, "pid": os.getpid(), "start": _proc_start(os.getpid()), **data}
    tmp = STATE_DIR / f".{run}.tmp"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, STATE_DIR / f"{run}.json")


def _remove_state(run: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        (STATE_DIR / f"{run}.json").unlink()


def _live_runs() -> set[str]:
    live: set[str] = set()
    if not STATE_DIR.is_dir():
        return live
    for path in STATE_DIR.glob("*.json"):
        try:
            record = json.loads(path.read_text())
            if _proc_start(int(record["pid"])) == record.get("start"):
                live.add(str(record["run"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return live


@contextlib.contextmanager
def _lock() -> Iterator[None]:
    """Serialise subnet choice and creation between concurrent launchers on this machine."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with open(STATE_DIR / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# -- names ----------------------------------------------------------------------------------------


def _run_of_netns(name: str) -> str | None:
    parts = name.split("-", 2)
    if len(parts) >= 2 and parts[0] == PREFIX and _RUN_RE.fullmatch(parts[1]):
        return parts[1]
    return None


def _run_of_link(name: str) -> str | None:
    run = name[len(PREFIX) : len(PREFIX) + 8]
    if name.startswith(PREFIX) and _RUN_RE.fullmatch(run):
        return run
    return None


def _check_host(host: str) -> str:
    if not _HOST_RE.fullmatch(host):
        raise TopologyError(
            f"hosts.{host}: a host name is 1-32 of a-z 0-9 _ - (starting with a letter or digit)"
        )
    return host


# -- the lab --------------------------------------------------------------------------------------


@dataclass
class Leftovers:
    """`llab*` objects whose run has no live owner."""

    namespaces: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)  # run ids with a dead owner's state file
    pids: list[int] = field(default_factory=list)  # processes still inside those namespaces

    def __bool__(self) -> bool:
        return bool(self.namespaces or self.links or self.runs)


class NetworkLab:
    """The hosts of one run. `create()` builds them, `destroy()` removes every object created
    (also a context manager). Both are synchronous and take ~10-50 ms per host; from asyncio
    call them through `asyncio.to_thread`."""

    def __init__(
        self,
        hosts: Mapping[str, LinkShape] | list[str],
        run_id: str | None = None,
    ) -> None:
        if not isinstance(hosts, Mapping):
            hosts = {h: LinkShape() for h in hosts}
        if not hosts:
            raise TopologyError("hosts: a NetworkLab needs at least one host")
        if len(hosts) > MAX_HOSTS:
            raise TopologyError(f"hosts: at most {MAX_HOSTS} hosts per run ({len(hosts)} given)")
        self.shapes: dict[str, LinkShape] = {_check_host(h): s for h, s in hosts.items()}
        self.run_id = run_id or secrets.token_hex(4)
        if not _RUN_RE.fullmatch(self.run_id):
            raise ValueError(f"run_id {self.run_id!r}: expected 8 lowercase hex digits")
        self.hosts = list(self.shapes)
        self.bridge = f"{PREFIX}{self.run_id}br"
        self.subnet: ipaddress.IPv4Network | None = None
        self._created_ns: list[str] = []
        self._created_links: list[str] = []

    # -- names and addresses ------------------------------------------------------------------

    def namespace(self, host: str) -> str:
        self._index(host)
        return f"{PREFIX}-{self.run_id}-{host}"

    def veth(self, host: str) -> str:
        """The root-namespace end of the host's link (inside the host it is `eth0`)."""
        return f"{PREFIX}{self.run_id}v{self._index(host)}"

    def _index(self, host: str) -> int:
        try:
            return self.hosts.index(host)
        except ValueError:
            raise KeyError(f"unknown host {host!r} (hosts: {', '.join(self.hosts)})") from None

    def address(self, host: str) -> str:
        """The host's IPv4 address: processes in it bind and advertise this."""
        return str(self._subnet()[self._index(host) + 2])

    @property
    def gateway(self) -> str:
        """The root namespace's address on the bridge (where hosts reach e.g. etcd)."""
        return str(self._subnet()[1])

    def _subnet(self) -> ipaddress.IPv4Network:
        if self.subnet is None:
            raise RuntimeError("NetworkLab addresses exist only after create()")
        return self.subnet

    def exec_prefix(self, host: str) -> list[str]:
        """Prepend to argv to run a process inside `host`."""
        return ["ip", "netns", "exec", self.namespace(host)]

    # -- create / destroy ---------------------------------------------------------------------

    def _record(self) -> None:
        _write_state(
            self.run_id,
            {
                "subnet": str(self.subnet) if self.subnet else None,
                "namespaces": self._created_ns,
                "links": self._created_links,
            },
        )

    def create(self) -> None:
        """Create bridge, namespaces and links; on any failure remove what was made and raise."""
        ok, reason = available()
        if not ok:
            raise NetnsError(f"hosts need network namespaces: {reason}")
        check_shapes(self.shapes)
        try:
            with _lock():
                self.subnet = pick_subnet()
                self._record()
                self._create_bridge()
            for host in self.hosts:
                self._create_host(host)
            self._record()
        except BaseException:
            self.destroy()
            raise

    def _create_bridge(self) -> None:
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        self._created_links.append(self.bridge)
        self._record()
        _run(["ip", "link", "set", self.bridge, "mtu", str(MTU)])
        _run(
            ["ip", "addr", "add", f"{self.gateway}/{self._subnet().prefixlen}", "dev", self.bridge]
        )
        _run(["ip", "link", "set", self.bridge, "up"])

    def _create_host(self, host: str) -> None:
        ns, outer = self.namespace(host), self.veth(host)
        inner = f"{PREFIX}{self.run_id}p{self._index(host)}"
        _run(["ip", "netns", "add", ns])
        self._created_ns.append(ns)
        self._record()
        _run(["ip", "-n", ns, "link", "set", "lo", "up"])
        _run(["ip", "link", "add", outer, "mtu", str(MTU), "type", "veth",
              "peer", "name", inner, "mtu", str(MTU), "netns", ns])  # fmt: skip
        self._created_links.append(outer)
        self._record()
        _run(["ip", "-n", ns, "link", "set", inner, "name", "eth0"])
        _run(["ip", "-n", ns, "addr", "add",
              f"{self.address(host)}/{self._subnet().prefixlen}", "dev", "eth0"])  # fmt: skip
        _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
        _run(["ip", "link", "set", outer, "master", self.bridge])
        _run(["ip", "link", "set", outer, "up"])
        shape = self.shapes[host]
        for args in shape.tc_commands("eth0"):  # host -> bridge
            _run(["tc", "-n", ns, *args])
        for args in shape.tc_commands(outer):  # bridge -> host
            _run(["tc", *args])

    def destroy(self) -> None:
        """Remove every namespace and link this lab created (killing any process still inside a
        namespace first). Idempotent; errors on objects already gone are ignored."""
        for ns in self._created_ns:
            _kill_inside(ns)
        for link in reversed(self._created_links):
            _delete_link(link)
        for ns in self._created_ns:
            _run(["ip", "netns", "del", ns], check=False)
        self._created_ns = []
        self._created_links = []
        _remove_state(self.run_id)

    def __enter__(self) -> NetworkLab:
        self.create()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.destroy()


# -- subnet choice --------------------------------------------------------------------------------


def _foreign_networks() -> list[tuple[ipaddress.IPv4Network, str]]:
    """IPv4 routes and addresses of the root namespace that are not on llab links."""
    found: list[tuple[ipaddress.IPv4Network, str]] = []
    for route in _ip_json("-4", "route", "show", "table", "all"):
        dst, dev = route.get("dst", ""), route.get("dev", "")
        if dst in ("", "default") or dev.startswith(PREFIX):
            continue
        with contextlib.suppress(ValueError):
            found.append((ipaddress.IPv4Network(dst, strict=False), f"route {dst} dev {dev}"))
    for link in _ip_json("-4", "addr", "show"):
        if link.get("ifname", "").startswith(PREFIX):
            continue
        for a in link.get("addr_info", []):
            net = ipaddress.IPv4Network(f"{a['local']}/{a['prefixlen']}", strict=False)
            found.append((net, f"address {a['local']}/{a['prefixlen']} on {link.get('ifname')}"))
    return found


def _used_lab_subnets() -> set[ipaddress.IPv4Network]:
    used = set()
    for link in _ip_json("-4", "addr", "show"):
        if link.get("ifname", "").startswith(PREFIX):
            for a in link.get("addr_info", []):
                used.add(ipaddress.IPv4Network(f"{a['local']}/{a['prefixlen']}", strict=False))
    if STATE_DIR.is_dir():
        for path in STATE_DIR.glob("*.json"):
            with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
                subnet = json.loads(path.read_text()).get("subnet")
                if subnet:
                    used.add(ipaddress.IPv4Network(subnet))
    return used


def pick_subnet() -> ipaddress.IPv4Network:
    """A free /24 inside LAB_RANGE; NetnsError if LAB_RANGE collides with this machine's
    routes or addresses (the lab never uses addresses outside its range)."""
    for net, what in _foreign_networks():
        if net.overlaps(LAB_RANGE):
            raise NetnsError(
                f"the lab's private range {LAB_RANGE} collides with {what} on this machine; "
                "the lab will not create hosts there"
            )
    used = _used_lab_subnets()
    for subnet in list(LAB_RANGE.subnets(new_prefix=24))[1:255]:
        if subnet not in used:
            return subnet
    raise NetnsError(f"no free /24 left in {LAB_RANGE} (clean leftovers with `lab clean`)")


# -- leftovers ------------------------------------------------------------------------------------


def _kill_inside(ns: str) -> list[int]:
    proc = _run(["ip", "netns", "pids", ns], check=False)
    pids = [int(p) for p in proc.stdout.split() if p.isdigit()] if proc.returncode == 0 else []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def _delete_link(name: str) -> None:
    proc = _run(["ip", "link", "del", name], check=False)
    if proc.returncode != 0 and "Cannot find device" not in proc.stderr:
        raise NetnsError(f"`ip link del {name}` failed: {proc.stderr.strip()}")


def find_leftovers(include_live: bool = False) -> Leftovers:
    """Namespaces and links named `llab*` (and state files) whose owning run is not alive.
    `include_live=True` lists every llab object, live runs included."""
    if shutil.which("ip") is None:
        return Leftovers()
    live = set() if include_live else _live_runs()
    found = Leftovers()
    runs: set[str] = set()
    listings = (
        (_ip_json("netns", "list"), "name", _run_of_netns, found.namespaces),
        (_ip_json("link", "show"), "ifname", _run_of_link, found.links),
    )
    for entries, key, run_of, into in listings:
        for entry in entries:
            name = entry.get(key, "")
            run = run_of(name)
            if name.startswith(PREFIX) and (run is None or run not in live):
                into.append(name)
                if run:
                    runs.add(run)
    if STATE_DIR.is_dir():
        for path in STATE_DIR.glob("*.json"):
            if path.stem not in live:
                runs.add(path.stem)
    found.runs = sorted(runs)
    for ns in found.namespaces:
        proc = _run(["ip", "netns", "pids", ns], check=False)
        found.pids += [int(p) for p in proc.stdout.split() if p.isdigit()]
    return found


def clean_leftovers(include_live: bool = False) -> Leftovers:
    """Remove what find_leftovers() finds (processes inside first); returns what was removed.
    Needs root; with nothing to clean it does nothing."""
    found = find_leftovers(include_live)
    for ns in found.namespaces:
        _kill_inside(ns)
    # bridges last: deleting a veth end removes its peer inside the namespace too
    for link in sorted(found.links, key=lambda n: n.endswith("br")):
        _delete_link(link)
    for ns in found.namespaces:
        _run(["ip", "netns", "del", ns], check=False)
    for run in found.runs:
        _remove_state(run)
    return found
