"""What to launch: fleets of engines (each with its sidecar) and one frontend.

A TopologySpec comes from flags (launch.cli_options.spec_from_options), from a TOML file
(TopologySpec.from_toml) or from code (TopologySpec.aggregated / .disaggregated). Every default
is defined once: here for the launcher's own settings, in lab.shared.settings for the serving
path (model name, socket settings).

TOML layout (every key optional):

    name = "exp1"                 # run name
    model = "mocker-model"
    router = "round-robin"
    frontend_port = 0             # 0 = the OS picks
    discovery = "file:/tmp/disc"  # default file:<run_dir>/discovery; also etcd://H:P, etcd
    ready_timeout_s = 60
    grace_s = 10
    migration_limit = 1           # lab.shared.settings.DEFAULT_MIGRATION_LIMIT; 0 = never
    enforce_disagg = false
    tokenizer = "/path/to/model"  # the frontend tokenizes with this HuggingFace tokenizer.json
    add_special_tokens = false    # true: a prompt with the tokenizer's BOS, as vLLM counts it
    # fleet defaults (apply to every [[fleet]] that does not set them)
    speedup = 1000.0
    decode_speedup = 1.0
    stream_interval = 1           # tokens per engine message (mocker --stream-interval)
    engine_args = { max_num_seqs = 128 }
    restart_engine = "never"
    restart_sidecar = "on-failure"
    extra_mocker_args = []        # appended to `mocker serve`
    extra_sidecar_args = []       # appended to `lab sidecar`, e.g. ["--grace-period", "1"]
    extra_frontend_args = []      # appended to `lab frontend`

    [sockets]                     # lab.shared.settings.SocketSettings
    client_nodelay = true
    server_nodelay = true
    split_writes = false
    pool_size = 2
    http_nodelay = true

    [[fleet]]                     # none -> one aggregated engine
    role = "prefill"              # aggregated | prefill | decode
    count = 1
    speedup = 500.0               # per-fleet overrides of the defaults above
    engine_args = { num_gpu_blocks = 4096 }   # merged over the top-level engine_args
    host = "gpu1"                 # run this fleet inside host gpu1 (default: the root namespace)
    ray_resource = "gpu_node"     # with --ray: on a Ray node with this resource (docs/ray.md)
    ray_labels = { zone = "a" }   # ... and/or on a Ray node with these labels

    # Hosts: Linux network namespaces on this machine (launch.netns), joined by a bridge,
    # MTU 1500, addresses in 10.213.N.0/24. Shaping keys: launch.linkshape (rate/burst/queue
    # with tbf; delay/jitter/loss need netem, which the lab refuses where the kernel lacks it).
    frontend_host = "fe"          # the frontend's host (default: the root namespace)
    [hosts.fe]
    [hosts.gpu1]
    rate = "1gbit"

    # Ray (`lab up --ray`, `lab sweep --ray`; docs/ray.md): a fleet or the frontend with a
    # ray_resource and/or ray_labels runs on a Ray node advertising that custom resource and
    # those labels, as a child of the node's agent actor; without either it runs where the
    # launcher runs.
    frontend_ray_resource = "fe_node"
    frontend_ray_labels = { role = "edge" }
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import pydantic
from pydantic import ConfigDict, Field, ValidationError, field_validator

from lab.shared.config_cli import MAX_SECONDS, field_like, setting
from lab.shared.engine_settings import EngineSettings
from lab.shared.frontend_settings import FrontendSettings
from lab.shared.json_arg import read_json_object
from lab.shared.settings import (
    DEFAULT_MODEL,
    DEFAULT_ROUTER,
    ROLES,
    SocketSettings,
)
from launch.errors import TopologyError
from launch.linkshape import KEYS as LINK_KEYS
from launch.linkshape import LinkShape, hosts_from_config

DEFAULT_SPEEDUP = 1000.0
DEFAULT_DECODE_SPEEDUP = 1.0
RestartPolicy = Literal["never", "on-failure", "always"]
RESTART_POLICIES: tuple[str, ...] = get_args(RestartPolicy)
DEFAULT_RESTART_ENGINE = "never"
DEFAULT_RESTART_SIDECAR = "on-failure"
DEFAULT_READY_TIMEOUT_S = 60.0
DEFAULT_GRACE_S = 10.0
DEFAULT_NAME = "lab"
#: The most engines one fleet may have.
MAX_FLEET = 256
Role = Literal["aggregated", "prefill", "decode"]
assert get_args(Role) == tuple(ROLES), "Role spells lab.shared.settings.ROLES"
Router = Literal["round-robin", "least-loaded", "random"]

#: A topology is validated as it is built (types, bounds, choices, unknown keys: pydantic, from
#: the same fields the processes' settings and the flags are); ints and bools are not guessed
#: from other types (a TOML `count = "2"` or `enforce_disagg = 1` is refused by name).
_CONFIG = ConfigDict(extra="forbid", strict=True, validate_assignment=True,
                     allow_inf_nan=False)

@dataclass(frozen=True)
class RayPlace:
    """Where on a Ray cluster: a node advertising `resource` (if any) and carrying `labels`
    (if any): a selector, which launch.ray_nodes resolves to the live nodes that satisfy it."""

    resource: str | None
    labels: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, resource: str | None, labels: dict[str, str]) -> RayPlace | None:
        """None when neither is given (the process runs where the launcher runs)."""
        if resource is None and not labels:
            return None
        return cls(resource, tuple(sorted(labels.items())))

    @property
    def agent(self) -> str:
        """The agent's name: `ray-RESOURCE`, `ray-KEY=VALUE`, joined by `,`."""
        return "ray-" + ",".join(
            ([self.resource] if self.resource else []) + [f"{k}={v}" for k, v in self.labels])

    def describe(self) -> str:
        parts = ([f"resource {self.resource}"] if self.resource else []) + [
            f"label {k}={v}" for k, v in self.labels]
        return " and ".join(parts)


#: A Ray custom resource name, as `ray start --resources` takes it.
_RAY_RESOURCE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,63}")
#: A Ray node label's key (`ray start --labels`; Kubernetes-style, an optional prefix/).
_RAY_LABEL_KEY = re.compile(r"([a-z0-9.\-]{1,253}/)?[A-Za-z0-9]([A-Za-z0-9_.\-]{0,61}[A-Za-z0-9])?")


def _ray_resource(value: str | None) -> str | None:
    if value is not None and (not _RAY_RESOURCE.fullmatch(value) or value in (
            "CPU", "GPU", "memory", "object_store_memory")):
        raise ValueError(f"{value!r}: expected a custom resource name (letters, digits, "
                         "'_', '.', '-'; not CPU/GPU/memory)")
    return value


def _ray_labels(value: dict[str, str]) -> dict[str, str]:
    for name, label in value.items():
        if not _RAY_LABEL_KEY.fullmatch(name) or not label:
            raise ValueError(f"{name!r} = {label!r}: expected a label key (letters, digits, "
                             "'_', '.', '-') and a non-empty string value")
    return value


@pydantic.dataclasses.dataclass(config=_CONFIG)
class FleetSpec:
    """`count` engines of one role, each with its own sidecar. A field that is an engine's
    setting is that setting (`field_like`): the same bounds and help."""

    role: Role
    count: int = setting(1, "Engines in the fleet.", ge=1, le=MAX_FLEET)
    engine_args: dict[str, Any] = field(default_factory=dict)
    speedup: float = field_like(EngineSettings, "speedup_ratio", default=DEFAULT_SPEEDUP,
                                help="Engine speedup ratio (0 = no simulated time).",
                                flag=None, metavar="R", default_text=f"{DEFAULT_SPEEDUP:g}")
    decode_speedup: float = field_like(EngineSettings, "decode_speedup_ratio",
                                       default=DEFAULT_DECODE_SPEEDUP,
                                       help="Extra decode speedup ratio.", flag=None,
                                       metavar="R",
                                       default_text=f"{DEFAULT_DECODE_SPEEDUP:g}")
    stream_interval: int = field_like(EngineSettings, "stream_interval")
    restart_engine: RestartPolicy = setting(DEFAULT_RESTART_ENGINE, "Restart policy of engines.",
                                            choices=RESTART_POLICIES)
    restart_sidecar: RestartPolicy = setting(DEFAULT_RESTART_SIDECAR,
                                             "Restart policy of sidecars.",
                                             choices=RESTART_POLICIES)
    extra_mocker_args: list[str] = field(default_factory=list)
    extra_sidecar_args: list[str] = field(default_factory=list)  # e.g. ["--grace-period", "1"]
    host: str | None = None  # a key of TopologySpec.hosts; None = the root namespace
    #: with --ray: the custom resource of the Ray node it runs on; None = the launcher's machine
    ray_resource: str | None = None
    #: with --ray: the labels of the Ray node it runs on (a label selector; {} = any node)
    ray_labels: dict[str, str] = field(default_factory=dict)

    _check_ray_resource = field_validator("ray_resource")(_ray_resource)
    _check_ray_labels = field_validator("ray_labels")(_ray_labels)


# Keys of FleetSpec that a topology can set for all fleets at once.
FLEET_SETTINGS = (
    "engine_args",
    "speedup",
    "decode_speedup",
    "stream_interval",
    "restart_engine",
    "restart_sidecar",
    "extra_mocker_args",
    "extra_sidecar_args",
)


@pydantic.dataclasses.dataclass(config=_CONFIG)
class TopologySpec:
    """What to launch. A field that is the frontend's setting is that setting (`field_like`)."""

    name: str = Field(default=DEFAULT_NAME, pattern=r"^[A-Za-z0-9_.\-]+$",
                      description="Run name (results/<timestamp>-<name>).")
    fleets: list[FleetSpec] = field(default_factory=lambda: [FleetSpec("aggregated")])
    model: str = field_like(FrontendSettings, "model_name", default=DEFAULT_MODEL,
                            help="Model name served by engines and frontend.", flag="--model")
    router: Router = field_like(FrontendSettings, "router", default=DEFAULT_ROUTER,
                                help="Frontend routing policy.")
    sockets: SocketSettings = field(default_factory=SocketSettings)
    frontend_port: int = setting(0, "Frontend HTTP port (0 = the OS picks a free one).", ge=0,
                                 le=65535, flag="--port")
    discovery: str | None = None  # None -> file:<run_dir>/discovery; "etcd" -> a local etcd
    ready_timeout_s: float = setting(
        DEFAULT_READY_TIMEOUT_S, "Every process must be ready within this time.", ge=0.1,
        le=MAX_SECONDS, flag="--ready-timeout", metavar="SECONDS")
    grace_s: float = setting(DEFAULT_GRACE_S, "Teardown: SIGTERM, wait this long, then SIGKILL.",
                             ge=0, le=MAX_SECONDS, flag="--grace", metavar="SECONDS")
    migration_limit: int = field_like(FrontendSettings, "migration_limit")
    enforce_disagg: bool = field_like(FrontendSettings, "enforce_disagg")
    add_special_tokens: bool = field_like(FrontendSettings, "add_special_tokens")
    # a HuggingFace tokenizer.json (or a model directory holding one) for the frontend;
    # None: the frontend's word tokenizer
    tokenizer: str | None = None
    extra_frontend_args: list[str] = field(default_factory=list)
    # host name -> its `[hosts.NAME]` table as written (shaping keys, launch.linkshape)
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)
    frontend_host: str | None = None
    #: with --ray: the custom resource of the Ray node the frontend runs on (None: local)
    frontend_ray_resource: str | None = None
    #: with --ray: the labels of the Ray node the frontend runs on
    frontend_ray_labels: dict[str, str] = field(default_factory=dict)

    _check_ray_resource = field_validator("frontend_ray_resource")(_ray_resource)
    _check_ray_labels = field_validator("frontend_ray_labels")(_ray_labels)

    @field_validator("model")
    @classmethod
    def _model_named(cls, value: str) -> str:
        if not value:
            raise ValueError("expected a non-empty string")
        return value

    @field_validator("discovery")
    @classmethod
    def _discovery_spec(cls, value: str | None) -> str | None:
        if value is not None and not _discovery_ok(value):
            raise ValueError(f"{value!r}: expected file:DIR, etcd://HOST:PORT[/prefix], or "
                             "etcd (a local etcd for the run)")
        return value

    # -- constructors -------------------------------------------------------------------------

    @classmethod
    def aggregated(cls, engines: int = 1, **settings: Any) -> TopologySpec:
        """`engines` aggregated engines; settings are TopologySpec fields or fleet settings."""
        fleet_kw, topo_kw = _split_settings(settings)
        fleets = [_built(FleetSpec, dict(role="aggregated", count=engines, **fleet_kw))]
        spec = _built(cls, dict(fleets=fleets, **topo_kw))
        spec.validate()
        return spec

    @classmethod
    def disaggregated(cls, prefill: int = 1, decode: int = 1, **settings: Any) -> TopologySpec:
        fleet_kw, topo_kw = _split_settings(settings)
        fleets = [_built(FleetSpec, dict(role=role, count=count, **_copy(fleet_kw)))
                  for role, count in (("prefill", prefill), ("decode", decode))]
        spec = _built(cls, dict(fleets=fleets, **topo_kw))
        spec.validate()
        return spec

    @classmethod
    def from_toml(cls, path: str | Path, *, check_system: bool = True) -> TopologySpec:
        """Read a topology file; errors name the file, the line and the key.

        With hosts, `check_system` also refuses what this machine cannot do (no network
        namespaces; delay/jitter/loss without netem) before anything is started."""
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise TopologyError(f"{path}: cannot read: {exc.strerror or exc}") from exc
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise TopologyError(f"{path}: {exc}") from exc
        spec = _from_mapping(data, _Locator(path, text))
        if check_system:
            _check_system(spec, _Locator(path, text))
        return spec

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TopologySpec:
        """Inverse of to_dict (used for state.json / the detached supervisor)."""
        data = dict(data)
        fleets = [_built(FleetSpec, f) for f in data.pop("fleets", [])]
        sockets = _built(SocketSettings, data.pop("sockets", {}))
        spec = _built(cls, dict(fleets=fleets or [FleetSpec("aggregated")], sockets=sockets,
                                **data))
        spec.validate()
        return spec

    # -- views --------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def disaggregated_mode(self) -> bool:
        return any(f.role != "aggregated" for f in self.fleets)

    def expected_workers(self) -> dict[str, int]:
        """role -> number of workers the frontend must see before /health is 200."""
        counts: dict[str, int] = {}
        for fleet in self.fleets:
            counts[fleet.role] = counts.get(fleet.role, 0) + fleet.count
        return counts

    def workers(self) -> list[tuple[FleetSpec, str]]:
        """Every worker with the suffix of its process names (engine-<suffix>, sidecar-<suffix>):
        "0", "1", ... for aggregated workers, "prefill-0", "decode-0", ... for the others."""
        counters: dict[str, int] = {}
        out: list[tuple[FleetSpec, str]] = []
        for fleet in self.fleets:
            for _ in range(fleet.count):
                index = counters.get(fleet.role, 0)
                counters[fleet.role] = index + 1
                out.append((fleet, f"{index}" if fleet.role == "aggregated"
                            else f"{fleet.role}-{index}"))
        return out

    def ray_placement(self) -> dict[str, RayPlace]:
        """process name -> the Ray node it runs on, for the processes placed on Ray."""
        out = {}
        for fleet, suffix in self.workers():
            place = RayPlace.of(fleet.ray_resource, fleet.ray_labels)
            if place is not None:
                out[f"engine-{suffix}"] = out[f"sidecar-{suffix}"] = place
        place = RayPlace.of(self.frontend_ray_resource, self.frontend_ray_labels)
        if place is not None:
            out["frontend"] = place
        return out

    def check_ray(self, address: str | None) -> None:
        """TopologyError when the Ray placement cannot run: placed without --ray, or with
        hosts, or with a file registry (the other nodes find the workers through etcd)."""
        placed = self.ray_placement()
        if not placed:
            return
        what = ", ".join(sorted({p.describe() for p in placed.values()}))
        if address is None:
            raise TopologyError(f"the topology places processes on Ray nodes ({what}): pass "
                                "--ray ADDRESS|auto")
        if self.hosts:
            raise TopologyError("hosts (network namespaces) and Ray placement (ray_resource) "
                                "cannot be combined in one topology")
        if self.discovery is not None and not self.discovery.startswith("etcd"):
            raise TopologyError(f"discovery: {self.discovery!r}: processes on Ray nodes find "
                                "each other through etcd: use etcd (a local etcd for the run, "
                                "the default with Ray placement) or etcd://HOST:PORT")

    def validate(self) -> None:
        """Raise TopologyError naming the first bad setting."""
        _validate_topology(self, _Locator(None, ""))

    def link_shapes(self) -> dict[str, LinkShape]:
        """host -> LinkShape (the topology must be valid)."""
        return hosts_from_config(self.hosts)

    def check_system(self) -> None:
        """TopologyError when this machine cannot provide the hosts (see from_toml)."""
        _check_system(self, _Locator(None, ""))


# -- helpers ------------------------------------------------------------------------------------


def _copy(kw: dict[str, Any]) -> dict[str, Any]:
    return {k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v)
            for k, v in kw.items()}


def _problem(err: Any, known: Any = ()) -> str:
    """One pydantic error as the topology says it: what is wrong, and the value given."""
    if err["type"] == "extra_forbidden":
        return f"unknown key (known: {', '.join(sorted(known))})"
    if err["type"] == "missing":
        return "missing key"
    msg = str(err["msg"]).removeprefix("Value error, ")
    return msg if "input" not in err or repr(err["input"]) in msg else (
        f"{msg}, got {err['input']!r}")


def _fields(cls: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _built(cls: Any, kwargs: dict[str, Any]) -> Any:
    """cls(**kwargs), its first refused value a TopologyError naming the key."""
    try:
        return cls(**kwargs)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"]) or "topology"
        raise TopologyError(f"{key}: {_problem(err, _fields(cls))}") from None


def _split_settings(settings: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    topo_fields = {f.name for f in dataclasses.fields(TopologySpec)} - {"fleets"}
    fleet_kw: dict[str, Any] = {}
    topo_kw: dict[str, Any] = {}
    for key, value in settings.items():
        if key in FLEET_SETTINGS:
            fleet_kw[key] = value
        elif key in topo_fields:
            topo_kw[key] = value
        else:
            raise TypeError(f"unknown topology setting {key!r}")
    return fleet_kw, topo_kw


def parse_engine_args(value: str | dict[str, Any] | None, what: str = "--engine-args") -> dict:
    """JSON text (starting with "{") or a path to a JSON file -> dict. Errors name `what`."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return dict(value)
    try:
        return read_json_object(value, what)
    except ValueError as exc:
        raise TopologyError(str(exc)) from exc


class _Locator:
    """Finds the line of a key in a TOML text, so value errors can name it."""

    _ARRAY = re.compile(r"^\s*\[\[\s*([A-Za-z0-9_.\-\"]+)\s*\]\]")
    _TABLE = re.compile(r"^\s*\[\s*([A-Za-z0-9_.\-\"]+)\s*\]")
    _KEY = re.compile(r"^\s*([A-Za-z0-9_.\-\"]+)\s*=")

    def __init__(self, path: Path | None, text: str) -> None:
        self.path = path
        self.lines = text.splitlines()

    def line_of(self, keypath: tuple[str | int, ...]) -> int | None:
        if not self.lines:
            return None
        table: tuple[str | int, ...] = ()
        counters: dict[str, int] = {}
        best: int | None = None
        for number, line in enumerate(self.lines, start=1):
            if m := self._ARRAY.match(line):
                name = m.group(1).strip('"')
                counters[name] = counters.get(name, -1) + 1
                table = (*name.split("."), counters[name])
            elif m := self._TABLE.match(line):
                table = tuple(m.group(1).strip('"').split("."))
            if m:
                if best is None and table[: len(keypath)] == keypath:
                    best = number
                continue
            if m := self._KEY.match(line):
                full = (*table, *m.group(1).strip('"').split("."))
                # an exact key, or the key holding an inline table / array the error is inside
                if keypath[: len(full)] == full:
                    return number
        return best

    def where(self, *keypaths: tuple[str | int, ...]) -> str:
        """"FILE:LINE: " of the first keypath found in the file ("" without a file)."""
        if self.path is None:
            return ""
        for keypath in keypaths:
            line = self.line_of(keypath)
            if line:
                return f"{self.path}:{line}: "
        return f"{self.path}: "

    def error(self, keypath: tuple[str | int, ...], problem: str) -> TopologyError:
        dotted = ""
        for part in keypath:
            dotted += f"[{part}]" if isinstance(part, int) else (f".{part}" if dotted else part)
        where = ""
        if self.path is not None:
            line = self.line_of(keypath)
            where = f"{self.path}:{line}: " if line else f"{self.path}: "
        return TopologyError(f"{where}{dotted or 'topology'}: {problem}")


_TOP_KEYS = set(_fields(TopologySpec)) - {"fleets"}
_TOML_TOP_KEYS = (_TOP_KEYS | set(FLEET_SETTINGS) | {"fleet"})


def _from_file(cls: Any, kwargs: dict[str, Any], loc: _Locator,
               keypath: Any = lambda key: (key,)) -> Any:
    """cls(**kwargs) from a TOML table, its first refused value a TopologyError naming the
    file, the line and the key (`keypath`: a field -> where it is written)."""
    try:
        return cls(**kwargs)
    except ValidationError as exc:
        err = exc.errors()[0]
        field_name, *inner = err["loc"] or ("",)
        where = (*keypath(str(field_name)), *inner) if field_name else ()
        raise loc.error(where, _problem(err, _fields(cls))) from None


def _from_mapping(data: dict[str, Any], loc: _Locator) -> TopologySpec:
    """The spec of a TOML file's table: every value checked as the fields define it."""
    for key in data:
        if key not in _TOML_TOP_KEYS:
            raise loc.error((key,), f"unknown key (known: {', '.join(sorted(_TOML_TOP_KEYS))})")
    sockets_data = data.get("sockets", {})
    if not isinstance(sockets_data, dict):
        raise loc.error(("sockets",), "expected a table")
    sockets = _from_file(SocketSettings, sockets_data, loc, lambda key: ("sockets", key))
    defaults = {k: data[k] for k in FLEET_SETTINGS if k in data}
    fleets_data = data.get("fleet", [{"role": "aggregated"}])
    if not isinstance(fleets_data, list):
        raise loc.error(("fleet",), "expected an array of tables ([[fleet]])")
    fleets_from_file = "fleet" in data

    def fleet_key(index: int, key: str) -> tuple[str | int, ...]:
        # a fleet value that came from a top-level default is reported at the default's line
        if key in defaults and (not fleets_from_file or loc.line_of(("fleet", index, key)) is None):
            return (key,)
        return ("fleet", index, key)

    fleets: list[FleetSpec] = []
    for index, entry in enumerate(fleets_data):
        if not isinstance(entry, dict):
            raise loc.error(("fleet", index), "expected a table")
        if "role" not in entry:
            raise loc.error(("fleet", index), "missing key 'role' (aggregated|prefill|decode)")
        merged = {**_copy(defaults), **entry}
        if isinstance(defaults.get("engine_args"), dict) and isinstance(
            entry.get("engine_args"), dict
        ):
            merged["engine_args"] = {**defaults["engine_args"], **entry["engine_args"]}
        fleets.append(_from_file(FleetSpec, merged, loc,
                                 lambda key, i=index: fleet_key(i, key)))
    topo = {k: data[k] for k in _TOP_KEYS if k in data and k != "sockets"}
    spec = _from_file(TopologySpec, dict(fleets=fleets, sockets=sockets, **topo), loc)
    _validate_topology(spec, loc, fleet_key)
    return spec


def _validate_topology(spec: TopologySpec, loc: _Locator,
                       fleet_key: Any = lambda index, key: ("fleet", index, key)) -> None:
    """What no single field can check: the fleets together, the hosts they name, the Ray
    placement, the tokenizer file on this machine (each value itself was checked as it was
    set; a spec for another machine, e.g. a pod's, is built without this check)."""
    if spec.tokenizer is not None:
        from lab.shared.hf_tokenizer import TokenizerFileError, tokenizer_json

        try:
            tokenizer_json(spec.tokenizer)
        except TokenizerFileError as exc:
            raise loc.error(("tokenizer",), str(exc)) from None
    _validate_hosts(spec, loc)
    if spec.frontend_host is not None and RayPlace.of(spec.frontend_ray_resource,
                                                      spec.frontend_ray_labels):
        raise loc.error(("frontend_host",), "the frontend runs in a host or on a Ray node "
                        "(frontend_ray_resource), not both")
    if not spec.fleets:
        raise loc.error(("fleet",), "at least one fleet is needed")
    for index, fleet in enumerate(spec.fleets):
        _check_host_ref(spec, fleet.host, fleet_key(index, "host"), loc)
        if fleet.host is not None and RayPlace.of(fleet.ray_resource, fleet.ray_labels):
            raise loc.error(fleet_key(index, "host"), "a fleet runs in a host or on a Ray node "
                            "(ray_resource), not both")
    roles = {f.role for f in spec.fleets}
    if "aggregated" in roles and len(roles) > 1:
        raise loc.error(("fleet",), "aggregated fleets cannot be mixed with prefill/decode fleets")
    if roles & {"prefill", "decode"} and roles != {"prefill", "decode"}:
        missing = ({"prefill", "decode"} - roles).pop()
        raise loc.error(("fleet",), f"a disaggregated topology needs a {missing} fleet")


_HOST_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")


def _validate_hosts(spec: TopologySpec, loc: _Locator) -> None:
    if not isinstance(spec.hosts, dict):
        raise loc.error(("hosts",), "expected a table of [hosts.NAME] tables")
    for name, table in spec.hosts.items():
        if not isinstance(name, str) or not _HOST_NAME.fullmatch(name):
            raise loc.error(("hosts", str(name)), "a host name is 1-32 of a-z 0-9 _ - "
                            "(starting with a letter or digit)")
        if not isinstance(table, dict):
            raise loc.error(("hosts", name), 'expected a table (e.g. rate = "1gbit")')
        for key in table:
            if key not in LINK_KEYS:
                raise loc.error(("hosts", name, key),
                                f"unknown key (known: {', '.join(LINK_KEYS)})")
        try:
            LinkShape.from_config(name, table)
        except TopologyError as exc:
            m = re.match(rf"hosts\.{re.escape(name)}\.(\w+)", str(exc))
            found = (("hosts", name, m.group(1)),) if m else ()
            raise TopologyError(f"{loc.where(*found, ('hosts', name))}{exc}") from None
    _check_host_ref(spec, spec.frontend_host, ("frontend_host",), loc)


def _check_host_ref(spec: TopologySpec, host: Any, key: tuple, loc: _Locator) -> None:
    if host is None:
        return
    if not isinstance(host, str) or host not in spec.hosts:
        known = ", ".join(spec.hosts) or "none declared; add a [hosts.NAME] table"
        raise loc.error(key, f"{host!r}: unknown host (hosts: {known})")


def _check_system(spec: TopologySpec, loc: _Locator) -> None:
    """Refuse hosts this machine cannot provide (namespaces, netem); no-op without hosts."""
    if not spec.hosts:
        return
    from launch import netns

    ok, reason = netns.available()
    if not ok:
        raise TopologyError(f"{loc.where(('hosts',))}hosts: this machine cannot create "
                            f"network namespaces: {reason}")
    for name, shape in spec.link_shapes().items():
        try:
            netns.check_shapes({name: shape})
        except TopologyError as exc:
            keys = [("hosts", name, k) for k in (*shape.netem_keys, "rate")]
            raise TopologyError(f"{loc.where(*keys, ('hosts', name))}{exc}") from None


def _discovery_ok(spec: str) -> bool:
    if spec == "etcd":
        return True
    if spec.startswith("file:"):
        return len(spec) > len("file:")
    return re.fullmatch(r"etcd://[^/:\s]+:\d{1,5}(/\S*)?", spec) is not None
