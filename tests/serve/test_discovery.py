"""FileRegistry (file:DIR): atomic records, heartbeat, TTL expiry, withdraw, watch."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from lab.serve.discovery import WorkerRecord, file_store, open_registry
from lab.serve.discovery.file_store import FileRegistry
from tests.waiting import wait_for


class FakeClock:
    """The registry's wall clock, moved by the test: TTL arithmetic without racing real time."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def time(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(file_store, "time", fake)
    return fake


def record(worker_id: str = "sidecar-0", role: str = "aggregated", **kw) -> WorkerRecord:
    return WorkerRecord(
        worker_id=worker_id,
        role=role,
        address="127.0.0.1:1234",
        model="mocker-model",
        context_length=32768,
        kv_block_size=32,
        total_kv_blocks=16384,
        instance_id="engine-0-abcd",
        load=kw.pop("load", {"running_requests": 0}),
        pid=os.getpid(),
        **kw,
    )


async def test_register_list_withdraw(tmp_path: Path) -> None:
    reg = open_registry(f"file:{tmp_path}")
    assert isinstance(reg, FileRegistry)
    await reg.register(record("sidecar-0"))
    await reg.register(record("sidecar-1", role="decode"))
    live = await reg.list()
    assert [r.worker_id for r in live] == ["sidecar-0", "sidecar-1"]
    assert live[1].role == "decode" and live[1].context_length == 32768
    assert live[0].updated_at == pytest.approx(time.time(), abs=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sidecar-0.json", "sidecar-1.json"]
    await reg.withdraw("sidecar-0")
    assert [r.worker_id for r in await reg.list()] == ["sidecar-1"]
    await reg.withdraw("sidecar-0")  # idempotent
    assert not (tmp_path / "sidecar-0.json").exists()


async def test_refresh_publishes_new_load(tmp_path: Path) -> None:
    reg = FileRegistry(tmp_path)
    rec = record(load={"running_requests": 1})
    await reg.register(rec)
    rec.load = {"running_requests": 7}
    await reg.refresh(rec)
    (live,) = await reg.list()
    assert live.load == {"running_requests": 7}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp files left


async def test_expiry_after_ttl_deletes_the_file(tmp_path: Path, clock: FakeClock) -> None:
    reg = FileRegistry(tmp_path, ttl_s=0.3, poll_s=0.05)
    await reg.register(record())
    clock.now += 0.29
    assert len(await reg.list()) == 1
    clock.now += 0.02
    assert await reg.list() == []
    assert not (tmp_path / "sidecar-0.json").exists()


async def test_heartbeat_keeps_a_record_alive(tmp_path: Path, clock: FakeClock) -> None:
    reg = FileRegistry(tmp_path, ttl_s=0.3, poll_s=0.05)
    rec = record()
    await reg.register(rec)
    for _ in range(8):  # 0.8 s, well past the ttl
        clock.now += 0.2
        await reg.refresh(rec)
        assert [r.worker_id for r in await reg.list()] == ["sidecar-0"]
    clock.now += 0.31  # the heartbeat stops: the record expires
    assert await reg.list() == []


async def test_watch_sees_add_change_and_remove(tmp_path: Path) -> None:
    reg = FileRegistry(tmp_path, ttl_s=5, poll_s=0.02)
    seen: list[list[str]] = []
    loads: list[int] = []
    scans = 0
    scan = reg._scan

    def counting_scan() -> list[WorkerRecord]:
        nonlocal scans
        scans += 1
        return scan()

    reg._scan = counting_scan  # type: ignore[method-assign]

    async def consume() -> None:
        async for live in reg.watch():
            seen.append([r.worker_id for r in live])
            loads.append(sum(r.load.get("running_requests", 0) for r in live))
            if len(seen) == 5:
                return

    async def snapshots(n: int) -> None:
        await wait_for(lambda: len(seen) == n, 5, f"watch snapshot {n}")

    async def polled() -> None:
        """The watcher has scanned the directory since the last write (twice, to be sure)."""
        target = scans + 2
        await wait_for(lambda: scans >= target, 5, "the watcher to poll")

    async with asyncio.timeout(10):
        async with asyncio.TaskGroup() as tg:
            tg.create_task(consume())
            await snapshots(1)
            rec = record("a")
            await reg.register(rec)
            await snapshots(2)
            await reg.refresh(rec)  # heartbeat only: not a change
            await polled()
            assert len(seen) == 2
            await reg.register(record("b"))
            await snapshots(3)
            rec.load = {"running_requests": 3}
            await reg.refresh(rec)  # new load: a change
            await snapshots(4)
            await reg.withdraw("a")
    assert seen == [[], ["a"], ["a", "b"], ["a", "b"], ["b"]]
    assert loads == [0, 0, 0, 3, 0]


async def test_watch_sees_expiry(tmp_path: Path) -> None:
    reg = FileRegistry(tmp_path, ttl_s=0.3, poll_s=0.02)
    await reg.register(record())
    sets: list[list[str]] = []
    async with asyncio.timeout(3):
        async for live in reg.watch():
            sets.append([r.worker_id for r in live])
            if not live:
                break
    assert sets == [["sidecar-0"], []]


async def test_two_registries_on_one_directory(tmp_path: Path, clock: FakeClock) -> None:
    writer = FileRegistry(tmp_path, ttl_s=0.3, poll_s=0.02)
    reader = FileRegistry(tmp_path, ttl_s=0.3, poll_s=0.02)
    await writer.register(record("w-0"))
    await reader.register(record("r-0"))
    assert [r.worker_id for r in await reader.list()] == ["r-0", "w-0"]
    assert [r.worker_id for r in await writer.list()] == ["r-0", "w-0"]
    await writer.withdraw("w-0")
    assert [r.worker_id for r in await reader.list()] == ["r-0"]
    # The writer stops its heartbeat: the *reader* expires and deletes its record.
    await writer.register(record("w-1"))
    reader_rec = record("r-0")
    for _ in range(5):
        clock.now += 0.1
        await reader.refresh(reader_rec)
    assert [r.worker_id for r in await reader.list()] == ["r-0"]
    assert not (tmp_path / "w-1.json").exists()


async def test_garbage_files_are_ignored_then_expire(tmp_path: Path) -> None:
    reg = FileRegistry(tmp_path, ttl_s=0.3)
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "notes.txt").write_text("ignored")
    await reg.register(record())
    assert [r.worker_id for r in await reg.list()] == ["sidecar-0"]
    old = time.time() - 10
    os.utime(tmp_path / "broken.json", (old, old))
    await reg.list()
    assert not (tmp_path / "broken.json").exists()
    assert (tmp_path / "notes.txt").exists()


def test_bad_specs_and_ids(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="file:DIR"):
        open_registry("etcd://x")
    with pytest.raises(ValueError, match="ttl_s"):
        FileRegistry(tmp_path, ttl_s=0)
    reg = FileRegistry(tmp_path)
    with pytest.raises(ValueError, match="worker id"):
        asyncio.run(reg.register(record("../evil")))
    assert open_registry(f"file:{tmp_path}", ttl_s=3).ttl_s == 3
