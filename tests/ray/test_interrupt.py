"""SIGTERM to `lab sweep --ray` mid-level: the sweep ends like Ctrl-C (exit 130, the completed
level kept) and leaves nothing on the cluster: no client actor, its placement group removed."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import ray

from lab.analysis.rundir import read_requests
from tests.procs import Proc
from tests.ray.conftest import RayCluster
from tests.ray.test_client import lab_argv, ray_args
from tests.ray.test_node_loss import wait_line


def test_sigterm_mid_level_leaves_nothing_on_the_cluster(
        ray_cluster: RayCluster, spawn: Callable[..., Proc], tmp_path: Path) -> None:
    server = spawn("fake", [sys.executable, "-m", "tests.load.fake_openai", "--port", "0",
                            "--token-delay-ms", "20"])
    run = tmp_path / "run"
    proc = subprocess.Popen(
        lab_argv("sweep", "--target", f"http://{server.address}", "--model", "fake-model",
                 "--conc", "3,6", "--duration", "8", "--osl", "8", "--no-plots", "--out",
                 str(run), *ray_args(ray_cluster)),
        stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        wait_line(proc, r"c=3: \d+ requests in", lines, 120)  # the first level is done
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, "".join(lines) + stderr
    assert set(read_requests(run)["concurrency"]) == {3}
    ray.init(address=ray_cluster.address, include_dashboard=False, log_to_driver=False)
    try:
        groups = ray.util.placement_group_table()
        live = [g for g in groups.values()
                if g.get("name") == "loadlab-client" and g.get("state") != "REMOVED"]
        assert not live, live
        assert "loadlab-client-0" not in {a for a in ray.util.list_named_actors()}
    finally:
        ray.shutdown()
