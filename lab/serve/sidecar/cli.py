"""`lab sidecar`: one sidecar in front of one engine."""

from __future__ import annotations

import logging
import sys

import click

from lab.shared.config_cli import options
from lab.shared.sidecar_settings import SidecarSettings


def _check_etcd(discovery: str) -> None:
    if discovery.startswith("etcd"):
        from lab.serve.discovery.etcd_store import parse_etcd_spec

        try:
            parse_etcd_spec(discovery)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="'--discovery'") from None


@click.command(name="sidecar", context_settings={"help_option_names": ["-h", "--help"]})
@options(SidecarSettings)
def sidecar(settings: SidecarSettings) -> None:
    """Run one sidecar: speak openengine.v1 to ENGINE, serve the request plane, register in
    discovery, watch the engine's liveness.

    Exit codes: 0 after SIGTERM/SIGINT (withdraw, grace period, drain; a second signal skips
    what is left of the grace and the drain), 1 when the engine is lost or unusable at start-up,
    2 on bad options.
    """
    s = settings
    _check_etcd(s.discovery)

    import uvloop

    from lab.serve.sidecar.sidecar import Sidecar

    logging.basicConfig(
        stream=sys.stderr,
        level=s.log_level.upper(),
        format=f"%(asctime)s %(levelname)s {s.worker_id} %(name)s: %(message)s",
    )
    try:
        code = uvloop.run(Sidecar(s).run())
    except* OSError as group:  # e.g. the listen address in use, or discovery (etcd) unreachable
        for exc in group.exceptions:
            logging.getLogger("lab.serve.sidecar").error("sidecar failed: %s", exc)
        code = 1
    sys.exit(code)
