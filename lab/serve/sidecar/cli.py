"""`lab sidecar`: one sidecar in front of one engine."""

from __future__ import annotations

import logging
import sys

import click

from lab.shared.config_cli import options
from lab.shared.settings import SocketSettings
from lab.shared.sidecar_settings import SidecarSettings
from lab.wire.address import split_address


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

    Exit codes: 0 after SIGTERM/SIGINT (withdraw, grace period, drain), 1 when the engine is
    lost or unusable at start-up, 2 on bad options.
    """
    s = settings
    _check_etcd(s.discovery)

    import uvloop

    from lab.serve.sidecar.sidecar import Sidecar, SidecarConfig

    logging.basicConfig(
        stream=sys.stderr,
        level=s.log_level.upper(),
        format=f"%(asctime)s %(levelname)s {s.worker_id} %(name)s: %(message)s",
    )
    host, port = split_address(s.listen, allow_port_zero=True)
    config = SidecarConfig(
        engine=s.engine,
        listen_host=host,
        listen_port=port,
        discovery=s.discovery,
        worker_id=s.worker_id,
        sockets=SocketSettings(server_nodelay=s.server_nodelay),
        grace_period_s=s.grace_period,
        inflight_timeout_s=s.inflight_timeout,
        startup_deadline_s=s.startup_deadline,
        connect_attempt_timeout_s=s.connect_attempt_timeout,
        retry_interval_s=s.retry_interval,
        heartbeat_s=s.heartbeat,
        ttl_s=s.ttl,
        stale_load_s=s.stale_load,
        stall_s=s.stall,
        probe_timeout_s=s.probe_timeout,
        keepalive_s=s.keepalive,
        keepalive_timeout_s=s.keepalive_timeout,
    )
    try:
        code = uvloop.run(Sidecar(config).run())
    except* OSError as group:  # e.g. the listen address in use, or discovery (etcd) unreachable
        for exc in group.exceptions:
            logging.getLogger("lab.serve.sidecar").error("sidecar failed: %s", exc)
        code = 1
    sys.exit(code)
