"""Link shaping settings of one host: parse `[hosts.NAME]` keys, build the `tc` commands.

    [hosts.gpu1]
    rate = "1gbit"        # tbf rate limit, each direction (bit units: bit, kbit, mbit, gbit)
    burst = "64kb"        # tbf bucket size in bytes (default: 2 ms worth of rate, >= 16 KiB)
    queue = "20ms"        # tbf queue length expressed as waiting time ("latency" in tc)
    delay = "0.25ms"      # one-way delay per direction of the link (netem)
    jitter = "0.05ms"     # netem delay variation (needs delay)
    loss = "0.1%"         # netem random loss

`delay`, `jitter` and `loss` need the kernel's netem qdisc; launch.netns refuses them where the
kernel lacks it, because faking delay in user space (a proxy) would change the very TCP behaviour
the lab measures.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from launch.errors import TopologyError

_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
_SIZE_UNITS = {"b": 1, "kb": 1024, "mb": 1024**2}
_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"

DEFAULT_QUEUE_S = 0.020
MIN_BURST_BYTES = 16 * 1024
BURST_TIME_S = 0.002
KEYS = ("rate", "burst", "queue", "delay", "jitter", "loss")


def _where(host: str, key: str) -> str:
    return f"hosts.{host}.{key}"


def parse_rate(value: Any, where: str = "rate") -> int:
    """'1gbit' / '100mbit' / 1e9 -> bits per second (int > 0)."""
    if isinstance(value, bool):
        raise TopologyError(f'{where} = {value!r}: expected a rate such as "1gbit"')
    if isinstance(value, int | float):
        bps = float(value)
    elif isinstance(value, str):
        m = re.fullmatch(_NUMBER + r"\s*([a-z]+)?", value.strip().lower())
        if not m:
            raise TopologyError(f'{where} = {value!r}: expected a rate such as "1gbit"')
        unit = m.group(2) or "bit"
        if unit.endswith("bps") or unit == "b":
            raise TopologyError(
                f"{where} = {value!r}: use bit units (bit, kbit, mbit, gbit); "
                f"tc reads {unit!r} as bytes per second"
            )
        if unit not in _RATE_UNITS:
            raise TopologyError(
                f"{where} = {value!r}: unknown unit {unit!r} (bit, kbit, mbit, gbit)"
            )
        bps = float(m.group(1)) * _RATE_UNITS[unit]
    else:
        raise TopologyError(f'{where} = {value!r}: expected a rate such as "1gbit"')
    if not math.isfinite(bps) or bps < 8000:
        raise TopologyError(f"{where} = {value!r}: must be at least 8kbit")
    return int(bps)


def parse_duration(value: Any, where: str) -> float:
    """'0.25ms' / '250us' / '1s' -> seconds. A unit is required (a bare number is ambiguous)."""
    if isinstance(value, str):
        m = re.fullmatch(_NUMBER + r"\s*(us|ms|s)", value.strip().lower())
        if m:
            return float(m.group(1)) * _TIME_UNITS[m.group(2)]
    raise TopologyError(f'{where} = {value!r}: expected a duration with a unit, e.g. "0.25ms"')


def parse_size(value: Any, where: str) -> int:
    """'64kb' / '1500b' / 65536 -> bytes."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str):
        m = re.fullmatch(_NUMBER + r"\s*(b|kb|mb)?", value.strip().lower())
        if m:
            size = int(float(m.group(1)) * _SIZE_UNITS[m.group(2) or "b"])
            if size > 0:
                return size
    raise TopologyError(f'{where} = {value!r}: expected a size in bytes, e.g. "64kb"')


def parse_loss(value: Any, where: str) -> float:
    """'0.1%' / 0.1 -> percent (0 < x <= 100)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        pct = float(value)
    elif isinstance(value, str) and re.fullmatch(_NUMBER + r"\s*%?", value.strip()):
        pct = float(value.strip().rstrip("%"))
    else:
        raise TopologyError(f'{where} = {value!r}: expected a percentage such as "0.1%"')
    if not 0 <= pct <= 100:
        raise TopologyError(f"{where} = {value!r}: must be between 0% and 100%")
    return pct


@dataclass(frozen=True)
class LinkShape:
    """How one host's link behaves, applied to both directions (see the module docstring)."""

    rate_bps: int | None = None
    burst_bytes: int | None = None
    queue_s: float = DEFAULT_QUEUE_S
    delay_s: float | None = None
    jitter_s: float | None = None
    loss_pct: float | None = None

    @classmethod
    def from_config(cls, host: str, table: Mapping[str, Any]) -> LinkShape:
        """Parse the shaping keys of `[hosts.HOST]` (other keys are ignored here);
        TopologyError naming `hosts.HOST.KEY` on a bad value."""
        rate = burst = delay = jitter = loss = None
        queue = DEFAULT_QUEUE_S
        if "rate" in table:
            rate = parse_rate(table["rate"], _where(host, "rate"))
        if "burst" in table:
            burst = parse_size(table["burst"], _where(host, "burst"))
        if "queue" in table:
            queue = parse_duration(table["queue"], _where(host, "queue"))
        if "delay" in table:
            delay = parse_duration(table["delay"], _where(host, "delay"))
        if "jitter" in table:
            jitter = parse_duration(table["jitter"], _where(host, "jitter"))
            if delay is None:
                raise TopologyError(f"{_where(host, 'jitter')}: needs a delay on the same host")
        if "loss" in table:
            loss = parse_loss(table["loss"], _where(host, "loss"))
        if (burst is not None or "queue" in table) and rate is None:
            raise TopologyError(f"hosts.{host}: burst/queue need a rate on the same host")
        return cls(rate, burst, queue, delay, jitter, loss)

    @property
    def needs_netem(self) -> bool:
        return bool(self.delay_s or self.jitter_s or self.loss_pct)

    @property
    def netem_keys(self) -> list[str]:
        keys = [("delay", self.delay_s), ("jitter", self.jitter_s), ("loss", self.loss_pct)]
        return [k for k, v in keys if v]

    @property
    def shaped(self) -> bool:
        return self.rate_bps is not None or self.needs_netem

    def effective_burst(self) -> int:
        assert self.rate_bps is not None
        if self.burst_bytes is not None:
            return self.burst_bytes
        return max(MIN_BURST_BYTES, int(self.rate_bps / 8 * BURST_TIME_S))

    def tc_commands(self, dev: str) -> list[list[str]]:
        """`tc` argument lists (without the leading `tc -n NS`) that shape egress of `dev`."""
        cmds: list[list[str]] = []
        tbf = []
        if self.rate_bps is not None:
            tbf = [
                "tbf",
                "rate", f"{self.rate_bps}bit",
                "burst", str(self.effective_burst()),
                "latency", f"{self.queue_s * 1e3:g}ms",
            ]  # fmt: skip
        if self.needs_netem:
            netem = ["netem"]
            if self.delay_s:
                netem += ["delay", f"{self.delay_s * 1e6:g}us"]
                if self.jitter_s:
                    netem += [f"{self.jitter_s * 1e6:g}us"]
            if self.loss_pct:
                netem += ["loss", f"{self.loss_pct:g}%"]
            cmds.append(["qdisc", "replace", "dev", dev, "root", "handle", "1:", *netem])
            if tbf:
                cmds.append(["qdisc", "replace", "dev", dev, "parent", "1:1", "handle", "2:", *tbf])
        elif tbf:
            cmds.append(["qdisc", "replace", "dev", dev, "root", "handle", "1:", *tbf])
        return cmds


def hosts_from_config(table: Any) -> dict[str, LinkShape]:
    """The `[hosts]` table of a topology: {name: {shaping keys}} -> {name: LinkShape}.
    TopologyError naming `hosts.NAME[.KEY]` for a non-table entry or an unknown key."""
    if not isinstance(table, Mapping):
        raise TopologyError(f"hosts = {table!r}: expected a table of [hosts.NAME] tables")
    shapes: dict[str, LinkShape] = {}
    for name, entry in table.items():
        if not isinstance(entry, Mapping):
            raise TopologyError(f'hosts.{name} = {entry!r}: expected a table (e.g. rate = "1gbit")')
        unknown = sorted(set(entry) - set(KEYS))
        if unknown:
            raise TopologyError(
                f"hosts.{name}.{unknown[0]}: unknown key (known: {', '.join(KEYS)})"
            )
        shapes[str(name)] = LinkShape.from_config(str(name), entry)
    return shapes
