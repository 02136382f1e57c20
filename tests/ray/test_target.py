"""`lab sweep --target URL --ray`: open-loop and timed levels over the 3 client actors, against
a fake OpenAI server (tests/load/fake_openai.py): a rate split into independent streams, one
per actor, every request sent once; a timed level ending on every actor."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from lab.analysis.rundir import read_requests
from lab.open_loop.arrivals import schedule_seed, split_streams
from tests.procs import Proc
from tests.ray.conftest import NODES, RayCluster
from tests.ray.test_client import lab, ray_args

TARGET = ["--model", "fake-model", "--isl", "8", "--osl", "4", "--no-plots", "--quiet"]


@pytest.fixture
def fake_url(spawn: Callable[..., Proc]) -> str:
    proc = spawn("fake", [sys.executable, "-m", "tests.load.fake_openai", "--port", "0",
                          "--token-delay-ms", "5"])
    return f"http://{proc.address}"


def test_rate_split_into_streams(ray_cluster: RayCluster, fake_url: str,
                                 tmp_path: Path) -> None:
    run = tmp_path / "run"
    out = lab("sweep", "--target", fake_url, "--rate", "40", "--requests", "60", "--seed", "3",
              *TARGET, "--out", str(run), *ray_args(ray_cluster))
    assert out.returncode == 0, out.stderr
    req = read_requests(run).sort_values("index")
    assert len(req) == 60 and req["ok"].all() and req["index"].is_unique
    # request i went to the actor of its stream, as split_streams splits the schedule
    streams = split_streams(60, NODES, schedule_seed(3, 40.0, 0))
    assert np.array_equal(req["client_proc"].to_numpy(), streams)
    # sent at the intended times, on the driver's clock (dispatch lag well under a second)
    assert ((req["sent_ns"] - req["intended_ns"]) < 1e9).all()


def test_timed_level(ray_cluster: RayCluster, fake_url: str, tmp_path: Path) -> None:
    run = tmp_path / "run"
    out = lab("sweep", "--target", fake_url, "--conc", "3", "--duration", "2", *TARGET,
              "--out", str(run), *ray_args(ray_cluster))
    assert out.returncode == 0, out.stderr
    req = read_requests(run)
    assert req["ok"].all() and req["index"].is_unique
    assert set(req["client_proc"]) == set(range(NODES))
    health = next(iter(json.loads((run / "client.json").read_text()).values()))
    # every actor stopped at the level's deadline: windows within a second of each other
    assert health["wall_s"] < 2 + 1.5


def test_no_cluster_at_the_address_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as unused:  # bound, not listening: connections are refused
        unused.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{unused.getsockname()[1]}"
        out = lab("sweep", "--ray", address, "--conc", "1", "--out", str(tmp_path / "run"),
                  timeout=60)
    assert out.returncode == 1, out.stderr
    assert f"--ray {address}: cannot connect" in out.stderr
    assert "Traceback" not in out.stderr


def test_a_cap_below_the_actors_names_it(ray_cluster: RayCluster, fake_url: str,
                                         tmp_path: Path) -> None:
    out = lab("sweep", "--target", fake_url, "--rate", "10", "--max-concurrency", "2",
              *TARGET, "--out", str(tmp_path / "run"), *ray_args(ray_cluster))
    assert out.returncode == 2, out.stderr
    assert "--max-concurrency" in out.stderr and "3 Ray client actors" in out.stderr
    assert "Traceback" not in out.stderr
