"""Discovery on Kubernetes: a one-member etcd StatefulSet (or the user's etcd, `--etcd`).

The records are leases that every sidecar refreshes, so the data dir is an emptyDir: a new
etcd pod starts empty and the sidecars register again within a heartbeat.
"""

from __future__ import annotations

from launch.k8s import objects as k
from launch.k8s.names import Names
from launch.k8s.options import ETCD_CLIENT_PORT, ETCD_PEER_PORT, RenderOptions

DATA_MOUNT = "/var/lib/etcd"


def etcd_endpoint(opts: RenderOptions, names: Names) -> str:
    """HOST:PORT every process's discovery points at."""
    return opts.etcd or f"{names.etcd}:{ETCD_CLIENT_PORT}"


def etcd_objects(opts: RenderOptions, names: Names) -> tuple[str, list[k.Obj]]:
    """(the `--discovery` spec, the objects to render: none when the user has an etcd)."""
    discovery = f"etcd://{etcd_endpoint(opts, names)}"
    if opts.etcd:
        return discovery, []
    client = f"http://0.0.0.0:{ETCD_CLIENT_PORT}"
    peer = f"http://127.0.0.1:{ETCD_PEER_PORT}"
    argv = ["etcd", "--name", "default", "--data-dir", f"{DATA_MOUNT}/default.etcd",
            "--listen-client-urls", client,
            "--advertise-client-urls", f"http://{names.etcd}:{ETCD_CLIENT_PORT}",
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"default={peer}"]
    container = k.container(
        "etcd", opts.etcd_image, argv,
        ports={"client": ETCD_CLIENT_PORT, "peer": ETCD_PEER_PORT},
        readiness=k.http_probe("/health", ETCD_CLIENT_PORT),
        liveness=k.http_probe("/health", ETCD_CLIENT_PORT),
        res=k.resources("250m", "256Mi"),
        mounts=[{"name": "data", "mountPath": DATA_MOUNT}])
    pod = k.pod_spec([container], volumes=[{"name": "data", "emptyDir": {}}])
    labels = names.labels("etcd")
    return discovery, [
        k.service(names.etcd, labels, {"client": ETCD_CLIENT_PORT}, opts.namespace,
                  headless=True),
        k.statefulset(names.etcd, labels, pod, names.etcd, opts.namespace),
    ]
