"""EtcdRegistry against a real etcd (started per test by launch.etcd.LocalEtcd).

The "frontend follows a worker that moves" test drives the frontend's own discovery consumer
(lab.serve.frontend.workers.WorkerSet) on the etcd registry; the worker processes are two
registry instances (one per "sidecar start"), not full sidecar processes.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from lab.serve.discovery import WorkerRecord, open_registry
from lab.serve.discovery.etcd_store import (
    DEFAULT_PREFIX,
    EtcdError,
    EtcdRegistry,
    parse_etcd_spec,
    prefix_range_end,
)
from launch.etcd import LocalEtcd, etcd_available
from launch.port_hold import PortHold
from tests.waiting import wait_for

LAB = [sys.executable, "-c", "from lab.cli import main; main()"]
ETCD_OK, ETCD_REASON = etcd_available()
needs_etcd = pytest.mark.skipif(not ETCD_OK, reason=f"etcd tests need etcd: {ETCD_REASON}")


def record(worker_id: str, address: str = "127.0.0.1:9", **kw) -> WorkerRecord:
    fields = {"role": "aggregated", "model": "m", "context_length": 4096, **kw}
    return WorkerRecord(worker_id=worker_id, address=address, **fields)


@pytest.fixture
async def etcd(tmp_path: Path) -> AsyncIterator[LocalEtcd]:
    async with LocalEtcd(tmp_path / "run") as server:
        yield server


class Collector:
    """Runs registry.watch() in a task and keeps every yielded set (as worker ids/addresses)."""

    def __init__(self) -> None:
        self.sets: list[list[tuple[str, str, dict]]] = []

    async def run(self, registry: EtcdRegistry) -> None:
        async for records in registry.watch():
            self.sets.append([(r.worker_id, r.address, r.load) for r in records])

    def ids(self, i: int = -1) -> list[str]:
        return [w for w, _, _ in self.sets[i]] if self.sets else []


# -- pure parts -------------------------------------------------------------------------------


def test_spec_parsing() -> None:
    assert parse_etcd_spec("etcd://127.0.0.1:2379") == ("http://127.0.0.1:2379", DEFAULT_PREFIX)
    assert parse_etcd_spec("etcd://h:1/lab/run7") == ("http://h:1", "/lab/run7/")
    assert parse_etcd_spec("etcd://h:1/lab/run7/") == ("http://h:1", "/lab/run7/")
    for bad in ("etcd://", "etcd://host", "etcd://host:notaport", "etcd:/x", "etcd://h:1?x=1"):
        with pytest.raises(ValueError, match="etcd://HOST:PORT"):
            open_registry(bad)
    with pytest.raises(ValueError, match="file:DIR or etcd://"):
        open_registry("zk://h:1")
    reg = open_registry("etcd://127.0.0.1:1/x", ttl_s=2.5)
    assert isinstance(reg, EtcdRegistry)
    assert (reg.prefix, reg.lease_ttl, reg.spec) == ("/x/", 3, "etcd://127.0.0.1:1/x")


def test_prefix_range_end() -> None:
    assert prefix_range_end("/a/") == b"/a0"
    assert prefix_range_end("ab") == b"ac"
    assert prefix_range_end("a\u00ff") == b"a\xc3\xc0"  # utf-8 c3 bf -> c3 c0


async def test_unreachable_etcd_names_the_url() -> None:
    hold = PortHold()  # bound, not listening: nothing listens there until the test ends
    port = hold.port
    reg = open_registry(f"etcd://127.0.0.1:{port}", request_timeout_s=2)
    try:
        with pytest.raises(EtcdError, match=f"etcd at http://127.0.0.1:{port} is unreachable"):
            await reg.register(record("w0"))
        with pytest.raises(EtcdError, match=f"http://127.0.0.1:{port}"):
            await reg.list()
    finally:
        await reg.close()
        hold.close()


# -- against a real etcd ----------------------------------------------------------------------


@needs_etcd
async def test_register_list_refresh_withdraw(etcd: LocalEtcd) -> None:
    reg = open_registry(etcd.spec)
    other = open_registry(etcd.spec + "/other-run")  # another prefix: invisible here
    try:
        await other.register(record("x"))
        await reg.register(record("w1", "127.0.0.1:11"))
        await reg.register(record("w0", "127.0.0.1:10"))
        listed = await reg.list()
        assert [(r.worker_id, r.address) for r in listed] == [
            ("w0", "127.0.0.1:10"),
            ("w1", "127.0.0.1:11"),
        ]
        assert all(r.updated_at > time.time() - 60 for r in listed)
        # refresh re-publishes the record (new load) under the same lease
        lease = reg._leases["w0"]
        await reg.refresh(record("w0", "127.0.0.1:10", load={"running": 3}))
        assert reg._leases["w0"] == lease
        assert {r.worker_id: r.load for r in await reg.list()}["w0"] == {"running": 3}
        await reg.withdraw("w0")
        assert [r.worker_id for r in await reg.list()] == ["w1"]
        assert "w0" not in reg._leases
        await reg.withdraw("w0")  # idempotent
        assert [r.worker_id for r in await other.list()] == ["x"]
    finally:
        await reg.close()
        await other.close()
    # close revoked the leases this registry held: its records are gone
    check = open_registry(etcd.spec)
    try:
        assert await check.list() == []
    finally:
        await check.close()


@needs_etcd
async def test_watch_sees_add_change_and_remove(etcd: LocalEtcd) -> None:
    writer = open_registry(etcd.spec)
    reader = open_registry(etcd.spec)
    seen = Collector()
    try:
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(seen.run(reader))
            await wait_for(lambda: len(seen.sets) == 1, 5, "the initial (empty) set")
            assert seen.sets[0] == []
            await writer.register(record("w0"))
            await wait_for(lambda: seen.ids() == ["w0"], 3, "w0 added")
            await writer.register(record("w1"))
            await wait_for(lambda: seen.ids() == ["w0", "w1"], 3, "w1 added")
            n = len(seen.sets)
            await writer.refresh(record("w1"))  # heartbeat, same content: not a change
            await writer.refresh(record("w1", load={"running": 1}))  # new load: a change
            await wait_for(lambda: len(seen.sets) > n, 3, "the load change")
            assert seen.sets[n:] == [
                [("w0", "127.0.0.1:9", {}), ("w1", "127.0.0.1:9", {"running": 1})]
            ]
            await writer.withdraw("w0")
            await wait_for(lambda: seen.ids() == ["w1"], 3, "w0 removed")
            task.cancel()
    finally:
        await writer.close()
        await reader.close()


WORKERS = 50


@needs_etcd
async def test_a_refresh_costs_one_record_and_an_unchanged_one_nothing(
    etcd: LocalEtcd, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With 50 workers registered: a heartbeat that changes nothing writes nothing (etcd's
    revision stands still, no watch event); one with a new load sample is one watch step naming
    that one record, which touches one record (counted comparisons, not the set's size) and
    leaves the router's per-role list as it was; a withdrawal removes just that worker."""
    from lab.serve.discovery import Changes
    from lab.serve.frontend.workers import WorkerSet
    from lab.shared.settings import SocketSettings

    class NoClient:
        def __init__(self, address: str, settings: SocketSettings) -> None:
            self.address = address

        async def close(self) -> None:
            return None

    compared = [0]
    same_content = WorkerRecord.same_content

    def counted(self: WorkerRecord, other: WorkerRecord) -> bool:
        compared[0] += 1
        return same_content(self, other)

    monkeypatch.setattr(WorkerRecord, "same_content", counted)
    writer = EtcdRegistry(etcd.client_url)
    reader = EtcdRegistry(etcd.client_url)
    workers = WorkerSet(reader, SocketSettings(), client_factory=NoClient)  # type: ignore[arg-type]
    steps: list[Changes] = []

    async def follow() -> None:
        async for changes in reader.watch_changes():
            steps.append(changes)
            await workers.apply_changes(changes)

    records = [record(f"w{i:02d}", f"127.0.0.1:{1000 + i}", load={"running": 0})
               for i in range(WORKERS)]
    try:
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(follow())
            for r in records:
                await writer.register(r)
            await wait_for(lambda: workers.counts()["aggregated"] == WORKERS, 10, "all workers")
            pool = workers._by_role["aggregated"]
            _, revision = await reader._range()
            for r in records:  # idle heartbeats: the same content
                await writer.refresh(r)
            _, after = await reader._range()
            assert after == revision, "an unchanged refresh wrote to etcd"
            n, compared[0] = len(steps), 0
            records[7].load = {"running": 3}
            await writer.refresh(records[7])
            await wait_for(lambda: len(steps) > n, 5, "the load change")
            assert steps[n:] == [Changes((steps[n].records[0],))]
            assert steps[n].records[0].worker_id == "w07"
            assert workers._workers["w07"].load == {"running": 3}
            assert compared[0] <= 2, f"{compared[0]} record comparisons for one change"
            assert workers._by_role["aggregated"] is pool  # no rebuild for a load sample
            n = len(steps)
            await writer.withdraw("w03")
            await wait_for(lambda: len(steps) > n, 5, "the withdrawal")
            assert steps[n:] == [Changes((), ("w03",))]
            assert "w03" not in {w.worker_id for w in workers._by_role["aggregated"]}
            assert workers.counts()["aggregated"] == WORKERS - 1
            task.cancel()
    finally:
        await writer.close()
        await reader.close()
        await workers.close()


@needs_etcd
async def test_refresh_after_lease_loss_registers_again(etcd: LocalEtcd) -> None:
    reg = open_registry(etcd.spec, ttl_s=2)
    try:
        await reg.register(record("w0"))
        await reg._revoke(reg._leases["w0"])  # as if the lease expired while we stalled
        assert await reg.list() == []
        await reg.refresh(record("w0"))
        assert [r.worker_id for r in await reg.list()] == ["w0"]
    finally:
        await reg.close()


KEEPER = textwrap.dedent(
    """
    import asyncio, sys
    from lab.serve.discovery import WorkerRecord, open_registry
    from lab.wire.ready import format_ready

    async def main():
        reg = open_registry(sys.argv[1], ttl_s=2)
        rec = WorkerRecord("doomed", "decode", "127.0.0.1:7", "m", 4096)
        await reg.register(rec)
        print(format_ready("sidecar", "doomed", rec.address), flush=True)
        while True:
            await asyncio.sleep(0.5)
            await reg.refresh(rec)

    asyncio.run(main())
    """
)


@needs_etcd
async def test_sigkilled_registrant_disappears_when_its_lease_expires(
    etcd: LocalEtcd, spawn
) -> None:
    proc = await asyncio.to_thread(spawn, "keeper", [sys.executable, "-c", KEEPER, etcd.spec])
    reader = open_registry(etcd.spec)
    seen = Collector()
    try:
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(seen.run(reader))
            await wait_for(lambda: seen.ids() == ["doomed"], 5, "the keeper's record")
            # kept alive by its heartbeat well past the 2 s TTL
            await asyncio.sleep(3.0)
            assert seen.ids() == ["doomed"]
            assert [r.worker_id for r in await reader.list()] == ["doomed"]
            proc.signal(signal.SIGKILL)
            gone_after = await wait_for(lambda: seen.ids() == [], 2 + 3, "lease expiry")
            task.cancel()
    finally:
        await reader.close()
    # no cleanup code ran: the lease (TTL 2 s, last kept alive <= 0.5 s before the kill) did it
    print(f"record of the SIGKILLed process gone {gone_after:.2f}s after the kill (ttl 2 s)")
    assert 0.5 < gone_after < 2 + 3


@needs_etcd
async def test_frontend_follows_a_worker_that_moves(etcd: LocalEtcd) -> None:
    from lab.serve.frontend.workers import WorkerSet
    from lab.shared.settings import SocketSettings

    class FakeClient:
        def __init__(self, address: str, settings: SocketSettings) -> None:
            self.address = address
            self.closed = False

        async def close(self) -> None:
            self.closed = True

    made: list[FakeClient] = []

    def factory(address: str, settings: SocketSettings) -> FakeClient:
        made.append(FakeClient(address, settings))
        return made[-1]

    frontend_view = open_registry(etcd.spec)
    first_start = open_registry(etcd.spec)
    second_start = open_registry(etcd.spec)
    workers = WorkerSet(frontend_view, SocketSettings(), client_factory=factory)

    def address_of(worker_id: str) -> str | None:
        worker = workers._workers.get(worker_id)
        return worker.record.address if worker else None

    try:
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(workers.watch())
            await first_start.register(record("sidecar-0", "10.0.0.1:5000"))
            await wait_for(lambda: address_of("sidecar-0") == "10.0.0.1:5000", 3, "first address")
            # the worker moves: its old process is gone (lease revoked), a new one registers
            # the same worker id at a new address
            await first_start.close()
            await second_start.register(record("sidecar-0", "10.0.0.2:6000"))
            await wait_for(lambda: address_of("sidecar-0") == "10.0.0.2:6000", 3, "the new address")
            task.cancel()
    finally:
        await second_start.close()
        await frontend_view.close()
        await workers.close()
    assert [c.address for c in made] == ["10.0.0.1:5000", "10.0.0.2:6000"]
    assert made[0].closed


@needs_etcd
async def test_watch_survives_an_etcd_restart(etcd: LocalEtcd) -> None:
    reader = open_registry(etcd.spec, poll_s=0.2)
    seen = Collector()
    try:
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(seen.run(reader))
            writer = open_registry(etcd.spec)
            await writer.register(record("w0"))
            await wait_for(lambda: seen.ids() == ["w0"], 5, "w0")
            await etcd.restart()  # the watch stream breaks; the watcher polls and reconnects
            await writer.register(record("w1"))
            await wait_for(lambda: seen.ids() == ["w0", "w1"], 5, "w1 after the restart")
            await writer.withdraw("w0")
            await wait_for(lambda: seen.ids() == ["w1"], 5, "w0 removed after the restart")
            await writer.close()
            task.cancel()
    finally:
        await reader.close()


@needs_etcd
async def test_frontend_process_follows_a_worker_that_moves(etcd: LocalEtcd, spawn) -> None:
    """`lab frontend --discovery etcd://...` as a real process; the worker is an in-test
    request-plane server registered in etcd. It moves to a new address (old registration gone,
    new one under the same worker id) and the frontend's requests follow it."""
    import aiohttp

    from lab.serve.request_plane import RequestPlaneServer

    served: dict[str, int] = {}

    def make_handler(tag: str):
        async def handler(req: dict, sink) -> None:
            served[tag] = served.get(tag, 0) + 1
            sink.chunk({"t": [5, 6]})
            usage = {"prompt_tokens": len(req["token_ids"]), "completion_tokens": 2}
            sink.end(
                {
                    "finish": "length",
                    "stop_reason": None,
                    "usage": {**usage, "cached_tokens": 0},
                    "handoff": None,
                    "error": None,
                    "worker_id": "sidecar-0",
                }
            )

        return handler

    old_server = RequestPlaneServer(make_handler("old"))
    new_server = RequestPlaneServer(make_handler("new"))
    old_address = await old_server.start("127.0.0.1", 0)
    first_start = open_registry(etcd.spec)
    second_start = open_registry(etcd.spec)
    body = {"model": "mocker-model", "prompt": "hello world", "max_tokens": 2, "stream": False}
    try:
        await first_start.register(record("sidecar-0", old_address, model="mocker-model"))
        frontend = await asyncio.to_thread(
            spawn,
            "frontend",
            [*LAB, "frontend", "--listen", "127.0.0.1:0", "--discovery", etcd.spec],
        )
        url = f"http://{frontend.address}/v1/completions"
        async with aiohttp.ClientSession() as http:

            async def complete() -> int:
                async with http.post(url, json=body) as resp:
                    await resp.read()
                    return resp.status

            async def until_served(tag: str) -> None:
                deadline = time.monotonic() + 10
                while served.get(tag, 0) == 0:
                    assert time.monotonic() < deadline, f"no request reached the {tag} address"
                    await complete()
                    await asyncio.sleep(0.05)

            await until_served("old")
            # move: the old process is gone (its lease revoked), a new one registers elsewhere
            await first_start.close()
            await old_server.close()
            new_address = await new_server.start("127.0.0.1", 0)
            await second_start.register(record("sidecar-0", new_address, model="mocker-model"))
            await until_served("new")
            old_count = served["old"]
            assert [await complete() for _ in range(3)] == [200, 200, 200]
            assert served["old"] == old_count and served["new"] >= 3
    finally:
        await first_start.close()
        await second_start.close()
        await old_server.close()
        await new_server.close()
