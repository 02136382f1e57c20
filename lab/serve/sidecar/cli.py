"""`lab sidecar`: one sidecar in front of one engine."""

from __future__ import annotations

import logging
import sys

import click

from lab.shared.settings import (
    DEFAULT_GRPC_CLIENT,
    GRPC_CLIENTS,
    DiscoveryTiming,
    SidecarTiming,
    SocketSettings,
)
from lab.shared.switches import ON_OFF, is_on, on_off


def _address(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, int]:
    from lab.wire.address import split_address

    try:
        return split_address(value, allow_port_zero=param.name == "listen")
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def _discovery(ctx: click.Context, param: click.Parameter, value: str) -> str:
    scheme, sep, rest = value.partition(":")
    if scheme == "etcd":
        from lab.serve.discovery.etcd_store import parse_etcd_spec

        try:
            parse_etcd_spec(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
        return value
    if scheme != "file" or not sep or not rest:
        raise click.BadParameter(f"{value!r}: expected file:DIR or etcd://HOST:PORT[/prefix]")
    return value


_POSITIVE = click.FloatRange(min=0.001)


@click.command(name="sidecar", context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--engine", required=True, callback=_address, help="The engine's gRPC address (host:port)."
)
@click.option(
    "--listen",
    default="127.0.0.1:0",
    show_default=True,
    callback=_address,
    help="Request-plane listen address (port 0 = pick a free port; the ready line names it).",
)
@click.option(
    "--discovery",
    required=True,
    callback=_discovery,
    help="Registry: file:DIR or etcd://HOST:PORT[/prefix].",
)
@click.option(
    "--worker-id",
    default="sidecar-0",
    show_default=True,
    help="This worker's id in discovery (the launcher passes its process name).",
)
@click.option(
    "--server-nodelay",
    type=ON_OFF,
    default=on_off(SocketSettings.server_nodelay),
    show_default=True,
    help="TCP_NODELAY on accepted request-plane sockets (set explicitly either way).",
)
@click.option(
    "--grpc-client",
    type=click.Choice(GRPC_CLIENTS),
    default=DEFAULT_GRPC_CLIENT,
    show_default=True,
    help="How Generate streams are read: h2 (batched HTTP/2, one pass per recv) or aio "
    "(grpc.aio, the reference). Control RPCs and the liveness watch always use grpc.aio.",
)
@click.option(
    "--grace-period",
    type=click.FloatRange(min=0),
    default=SidecarTiming.grace_period_s,
    show_default=True,
    help="Seconds to keep serving after withdrawing (SIGTERM), or to drain (engine lost).",
)
@click.option(
    "--inflight-timeout",
    type=click.FloatRange(min=0),
    default=SidecarTiming.inflight_timeout_s,
    show_default=True,
    help="SIGTERM: seconds to wait for in-flight requests after the grace period.",
)
@click.option(
    "--startup-deadline",
    type=_POSITIVE,
    default=SidecarTiming.startup_deadline_s,
    show_default=True,
    help="Seconds to wait for the engine to answer at start-up (then exit 1).",
)
@click.option(
    "--connect-attempt-timeout",
    type=_POSITIVE,
    default=SidecarTiming.connect_attempt_timeout_s,
    show_default=True,
    help="Seconds per connection attempt; also the time the liveness watch has to open.",
)
@click.option(
    "--retry-interval",
    type=_POSITIVE,
    default=SidecarTiming.retry_interval_s,
    show_default=True,
    help="Seconds between start-up connection attempts.",
)
@click.option(
    "--heartbeat",
    type=_POSITIVE,
    default=DiscoveryTiming.heartbeat_s,
    show_default=True,
    help="Seconds between GetLoad polls / discovery record refreshes.",
)
@click.option(
    "--ttl",
    type=_POSITIVE,
    default=DiscoveryTiming.ttl_s,
    show_default=True,
    help="Discovery record time-to-live in seconds (must exceed --heartbeat).",
)
@click.option(
    "--stale-load",
    type=_POSITIVE,
    default=SidecarTiming.stale_load_s,
    show_default=True,
    help="Engine lost when no fresh GetLoad sample arrived for this long while busy.",
)
@click.option(
    "--stall",
    type=_POSITIVE,
    default=SidecarTiming.stall_s,
    show_default=True,
    help="Seconds without token progress while requests are in flight (or, idle, without a "
    "GetLoad answer) after which the engine counts as stalled: the worker withdraws, its "
    "in-flight requests end retryable, and it registers again once the engine serves. Keep it "
    "above the longest prefill (a 32k-token prompt takes ~0.7 s at speedup 1).",
)
@click.option(
    "--probe-timeout",
    type=_POSITIVE,
    default=SidecarTiming.probe_timeout_s,
    show_default=True,
    help="Bound of one readiness probe (a one-token canary generation; on a prefill engine a "
    "GetLoad whose timestamp advances). The worker registers only after a probe succeeds.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
    help="Log level (logs go to stderr).",
)
def sidecar(
    engine: tuple[str, int],
    listen: tuple[str, int],
    discovery: str,
    worker_id: str,
    server_nodelay: str,
    grace_period: float,
    inflight_timeout: float,
    startup_deadline: float,
    connect_attempt_timeout: float,
    retry_interval: float,
    heartbeat: float,
    ttl: float,
    stale_load: float,
    grpc_client: str,
    stall: float,
    probe_timeout: float,
    log_level: str,
) -> None:
    """Run one sidecar: speak openengine.v1 to ENGINE, serve the request plane, register in
    discovery, watch the engine's liveness.

    Exit codes: 0 after SIGTERM/SIGINT (withdraw, grace period, drain), 1 when the engine is
    lost or unusable at start-up, 2 on bad options.
    """
    if ttl <= heartbeat:
        raise click.BadParameter(
            f"{ttl:g} must exceed --heartbeat {heartbeat:g}", param_hint="--ttl"
        )
    if not worker_id or "/" in worker_id or worker_id.startswith("."):
        raise click.BadParameter(
            f"{worker_id!r}: must be a file-name-safe id", param_hint="--worker-id"
        )

    import uvloop

    from lab.serve.sidecar.worker import Sidecar, SidecarConfig

    logging.basicConfig(
        stream=sys.stderr,
        level=log_level.upper(),
        format=f"%(asctime)s %(levelname)s {worker_id} %(name)s: %(message)s",
    )
    config = SidecarConfig(
        engine=f"{engine[0]}:{engine[1]}",
        listen_host=listen[0],
        listen_port=listen[1],
        discovery=discovery,
        worker_id=worker_id,
        sockets=SocketSettings(server_nodelay=is_on(server_nodelay)),
        grace_period_s=grace_period,
        inflight_timeout_s=inflight_timeout,
        startup_deadline_s=startup_deadline,
        connect_attempt_timeout_s=connect_attempt_timeout,
        retry_interval_s=retry_interval,
        heartbeat_s=heartbeat,
        ttl_s=ttl,
        stale_load_s=stale_load,
        grpc_client=grpc_client,
        stall_s=stall,
        probe_timeout_s=probe_timeout,
    )
    try:
        code = uvloop.run(Sidecar(config).run())
    except* OSError as group:  # e.g. the listen address in use, or discovery (etcd) unreachable
        for exc in group.exceptions:
            logging.getLogger("lab.serve.sidecar").error("sidecar failed: %s", exc)
        code = 1
    sys.exit(code)
