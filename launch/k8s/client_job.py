"""The load client as an Indexed Job: N pods, pod I runs `lab sweep --target --shard I/N`.

Closed loop (`--conc`), pod I runs C/N slots of every level C; open loop (`--rate`), pod I
sends stream I of N of every rate level's schedule (`lab.load.stream_share`). Each pod waits
for the frontend's readiness (an init container polling its /health), meets
the other shards in etcd (`--barrier`, keyed by the Job's uid so a re-run never meets an old
one), starts at the shared wall-clock time, and writes its shard's run directory to
`/results/<job uid>/shard-<I>` on a shared volume; `lab merge /results/<uid>/shard-*` joins
them into one run and report.
"""

from __future__ import annotations

from launch.k8s import objects as k
from launch.k8s.names import Names
from launch.k8s.options import RenderOptions

RESULTS_MOUNT = "/results"
#: The group of the image's non-root user (launch/k8s/Dockerfile: USER 65532:65532).
IMAGE_GID = 65532
JOB_INDEX = "JOB_COMPLETION_INDEX"
JOB_UID = "JOB_UID"
#: Polls GET URL until it answers 200; the image's interpreter, no other tool needed.
WAIT_FOR_URL = (
    "import sys, time, urllib.request\n"
    "url = sys.argv[1]\n"
    "while True:\n"
    "    try:\n"
    "        if urllib.request.urlopen(url, timeout=2).status == 200:\n"
    "            break\n"
    "    except OSError:\n"
    "        pass\n"
    "    time.sleep(1)\n"
)


def default_conc(shards: int) -> str:
    return ",".join(str(c * shards) for c in (1, 8, 32))


def client_objects(opts: RenderOptions, names: Names, target: str, model: str, etcd: str,
                   health_path: str, extra: tuple[str, ...] = ()) -> list[k.Obj]:
    n = opts.client_shards
    env = [
        {"name": JOB_INDEX, "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
        {"name": JOB_UID, "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.labels['batch.kubernetes.io/controller-uid']"}}},
    ]
    index, uid = k.ref(JOB_INDEX), k.ref(JOB_UID)
    levels = (["--rate", opts.client_rate] if opts.client_rate
              else ["--conc", opts.client_conc or default_conc(n)])
    argv = ["lab", "sweep", "--target", target, "--model", model, *levels,
            "--shard", f"{index}/{n}", "--barrier", f"etcd://{etcd}/{uid}",
            "--out", f"{RESULTS_MOUNT}/{uid}/shard-{index}", "--quiet", "--no-plots",
            *extra, *opts.client_args]
    mounts = [{"name": "results", "mountPath": RESULTS_MOUNT}]
    client = k.container("client", opts.image, argv, env=env, mounts=mounts,
                         res=k.resources(opts.client.cpu, opts.client.memory))
    wait = k.container("wait-for-frontend", opts.image,
                       ["python3", "-c", WAIT_FOR_URL, f"{target}{health_path}"],
                       res=k.resources("100m", "64Mi"))
    claim = opts.results_claim or f"{names.client}-results"
    pod = k.pod_spec([client], init=[wait], restart="Never",
                     volumes=[{"name": "results",
                               "persistentVolumeClaim": {"claimName": claim}}])
    # the image's user may write the claim (a fresh volume is root's)
    pod["securityContext"] = {"fsGroup": IMAGE_GID}
    labels = names.labels("client")
    out = []
    if opts.results_claim is None:
        out.append({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": k.metadata(claim, labels, opts.namespace),
            # every shard pod writes its own directory, possibly from different nodes
            "spec": {"accessModes": ["ReadWriteMany"],
                     "resources": {"requests": {"storage": "1Gi"}}},
        })
    out.append(k.indexed_job(names.client, labels, pod, n, opts.namespace))
    return out
