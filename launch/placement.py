"""Where each process of a run lives: the argv prefix and the address to bind, per host.

Without hosts everything runs in the root namespace on 127.0.0.1. With hosts (a
launch.netns.NetworkLab), a process placed on a host runs under `ip netns exec` and binds the
host's address; its peers in other hosts and the launcher in the root namespace reach it there.
A sidecar left in the root namespace binds the bridge's root address instead of loopback, so a
frontend inside a host can reach it too. On a Ray cluster (`--ray`, launch.ray_fleet) every
process binds its node's address, which the other nodes reach.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from launch.commands import LISTEN_HOST


@dataclass(frozen=True)
class Placement:
    prefixes: dict[str, list[str]] = field(default_factory=dict)  # host -> argv prefix
    addresses: dict[str, str] = field(default_factory=dict)  # host -> its address
    namespaces: dict[str, str] = field(default_factory=dict)  # host -> namespace name
    gateway: str | None = None  # the root namespace's address on the bridge
    #: with --ray: this machine's address on the cluster, which the processes of other nodes
    #: reach: every process here binds it instead of 127.0.0.1
    node_address: str | None = None

    @classmethod
    def from_lab(cls, lab: Any) -> Placement:
        """From a created launch.netns.NetworkLab."""
        return cls(
            prefixes={h: lab.exec_prefix(h) for h in lab.hosts},
            addresses={h: lab.address(h) for h in lab.hosts},
            namespaces={h: lab.namespace(h) for h in lab.hosts},
            gateway=lab.gateway,
        )

    def prefix(self, host: str | None) -> list[str]:
        return [] if host is None else list(self.prefixes[host])

    def bind_address(self, host: str | None, *, reachable_from_hosts: bool = False) -> str:
        """The address a process on `host` (None = root namespace) listens on."""
        if host is not None:
            return self.addresses[host]
        if self.node_address is not None:
            return self.node_address
        if reachable_from_hosts and self.gateway is not None:
            return self.gateway
        return LISTEN_HOST

    def describe(self) -> dict[str, dict[str, str]]:
        """For state.json / config.json: host -> namespace and address."""
        return {h: {"namespace": self.namespaces.get(h, ""), "address": a}
                for h, a in self.addresses.items()}
