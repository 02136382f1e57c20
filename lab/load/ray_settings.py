"""`lab sweep`'s Ray options, defined once (the click options come from here): where the load
client's processes run when they run on a Ray cluster (docs/ray.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from lab.load.client_settings import MAX_CLIENT_PROCS
from lab.shared.config_cli import MAX_SECONDS, Settings, setting
from lab.shared.ray_connect import ray_address_setting

#: The CPUs a client actor's placement-group bundle may ask for.
MAX_CLIENT_CPUS = 1024.0
#: Clock pings per client actor per level; the one with the smallest round trip gives the offset.
DEFAULT_CLOCK_PINGS = 8
MAX_CLOCK_PINGS = 1000


class RaySettings(Settings):
    """The load client as Ray async actors, one per client node (`--ray`)."""

    ray: str | None = ray_address_setting(
        "the load client's processes as Ray actors, and the processes the topology places on "
        "Ray nodes (`ray_resource`, `ray_labels`) under those nodes' agents,", "local processes")
    ray_client_nodes: int | None = setting(
        None, "With --ray: client actors, one placement-group bundle each, spread over the "
        "nodes (each level's concurrency and rates are split over them).", ge=1,
        le=MAX_CLIENT_PROCS, metavar="N", default_text="one per alive node")
    ray_spread: Literal["spread", "strict-spread"] = setting(
        "spread", "With --ray: the placement group's strategy: `spread` (best effort) or "
        "`strict-spread` (every actor on its own node, or the sweep does not start).",
        choices=("spread", "strict-spread"))
    ray_client_cpus: float = setting(
        1.0, "With --ray: CPUs reserved by each client actor's bundle.", gt=0,
        le=MAX_CLIENT_CPUS, metavar="CPUS")
    ray_client_resource: str | None = setting(
        None, "With --ray: a custom resource each client actor's bundle also asks one unit of "
        "(`ray start --resources '{\"NAME\": 1}'` on the client nodes), so the client runs "
        "only there.", metavar="NAME", default_text="any node")
    ray_clock_pings: int = setting(
        DEFAULT_CLOCK_PINGS, "With --ray: clock pings per actor per level (NTP-style: the "
        "offset of the ping with the smallest round trip).", ge=1, le=MAX_CLOCK_PINGS)
    ray_connect_timeout: float = setting(
        60.0, "With --ray: how long the client actors get to start on their nodes.", gt=0,
        le=MAX_SECONDS, metavar="SECONDS")

    @model_validator(mode="after")
    def _needs_ray(self) -> RaySettings:
        given = [name for name in self.model_fields_set - {"ray"}
                 if getattr(self, name) != type(self).model_fields[name].default]
        if given and self.ray is None:
            flags = ", ".join("--" + n.replace("_", "-") for n in sorted(given))
            raise ValueError(f"{flags} need{'s' if len(given) == 1 else ''} --ray")
        return self
