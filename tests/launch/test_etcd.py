"""launch.etcd.LocalEtcd: a real etcd per run (skipped with the reason when etcd is absent)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest

from lab.serve.discovery import WorkerRecord, open_registry
from launch.errors import LaunchError
from launch.etcd import LocalEtcd, etcd_available

ETCD_OK, ETCD_REASON = etcd_available()
needs_etcd = pytest.mark.skipif(not ETCD_OK, reason=f"needs etcd: {ETCD_REASON}")


def listening(pid: int) -> set[tuple[str, int]]:
    return {
        (c.laddr.ip, c.laddr.port)
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    }


@needs_etcd
async def test_local_etcd_serves_on_loopback_and_stops(tmp_path: Path) -> None:
    run = tmp_path / "run"
    etcd = LocalEtcd(run, hosts=("127.0.0.1", "127.0.0.2"), env={"LAB_TEST_MARK": "etcd-x"})
    spec = await etcd.start()
    try:
        assert spec == f"etcd://127.0.0.1:{etcd.client_port}" == etcd.spec
        pid = etcd.pid
        assert pid is not None
        # loopback only; client ports on both hosts asked for, the peer port on 127.0.0.1
        assert listening(pid) == {
            ("127.0.0.1", etcd.client_port),
            ("127.0.0.2", etcd.client_port),
            ("127.0.0.1", etcd.peer_port),
        }
        assert etcd.client_port != etcd.peer_port
        # data dir and log inside the run directory
        assert (run / "etcd" / "data" / "member").is_dir()
        assert (run / "logs" / "etcd.log").stat().st_size > 0
        assert psutil.Process(pid).environ()["LAB_TEST_MARK"] == "etcd-x"
        # it is a working registry, through either address
        for host in ("127.0.0.1", "127.0.0.2"):
            reg = open_registry(f"etcd://{host}:{etcd.client_port}")
            try:
                await reg.register(WorkerRecord(f"w-{host}", "decode", "a:1", "m", 1))
                assert f"w-{host}" in [r.worker_id for r in await reg.list()]
            finally:
                await reg.close()
    finally:
        code = await etcd.stop()
    # etcd shuts down cleanly on SIGTERM, then re-raises it: -SIGTERM, not -SIGKILL
    assert code in (0, -signal.SIGTERM)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert await etcd.stop() is None  # idempotent


@needs_etcd
async def test_stop_falls_back_to_sigkill(tmp_path: Path) -> None:
    async with LocalEtcd(tmp_path, stop_grace_s=0.5) as etcd:
        pid = etcd.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)  # SIGTERM stays pending: only SIGKILL ends it
        assert await etcd.stop() == -signal.SIGKILL


async def test_missing_binary_is_a_clear_error(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LAB_ETCD_BINARY", str(tmp_path / "no-such-etcd"))
    with pytest.raises(LaunchError, match=r"apt-get install -y etcd-server"):
        await LocalEtcd(tmp_path).start()


async def test_an_etcd_that_exits_is_reported_with_its_log(tmp_path: Path, monkeypatch) -> None:
    fake = tmp_path / "fake-etcd"
    fake.write_text("#!/bin/sh\necho 'cannot start: broken on purpose' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("LAB_ETCD_BINARY", str(fake))
    with pytest.raises(LaunchError) as err:
        await LocalEtcd(tmp_path / "run").start()
    text = str(err.value)
    assert "etcd did not become ready: exited with code 3" in text
    assert "broken on purpose" in text and "etcd.log" in text
