"""The embedded default registry: one JSON file per worker in a directory.

    <dir>/<worker_id>.json      the record (WorkerRecord.to_json)

Writes are atomic (write a hidden temp file, then `os.replace`), so a reader sees either the old
or the new record, never half of one. Liveness is the record's `updated_at` (wall-clock seconds,
set on every register/refresh): a record older than `ttl_s` is expired, and any reader that sees
it deletes the file. `watch()` polls the directory cheaply (one `stat` per file; a file is read
only when its mtime/size/inode changed) and yields the live set when it changes.

Every operation is a handful of small syscalls on a local directory, so they run inline on the
event loop (cheaper than a thread hop).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import orjson

from lab.serve.discovery.base import Registry, WorkerRecord
from lab.shared.settings import DiscoveryTiming

_SUFFIX = ".json"


def _check_worker_id(worker_id: str) -> str:
    if not worker_id or "/" in worker_id or worker_id.startswith(".") or "\0" in worker_id:
        raise ValueError(f"worker id {worker_id!r}: must be a non-empty file name without '/'")
    return worker_id


class FileRegistry(Registry):
    """`file:DIR`: records are files; see the module docstring."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        ttl_s: float = DiscoveryTiming.ttl_s,
        poll_s: float = 0.2,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s {ttl_s!r}: must be > 0")
        if poll_s <= 0:
            raise ValueError(f"poll_s {poll_s!r}: must be > 0")
        self.directory = Path(directory)
        self.ttl_s = float(ttl_s)
        self.poll_s = float(poll_s)
        self.directory.mkdir(parents=True, exist_ok=True)
        # file name -> ((mtime_ns, size, ino), record or None when unreadable)
        self._cache: dict[str, tuple[tuple[int, int, int], WorkerRecord | None]] = {}

    # -- writes -------------------------------------------------------------------------------

    def _path(self, worker_id: str) -> Path:
        return self.directory / (_check_worker_id(worker_id) + _SUFFIX)

    def _write(self, record: WorkerRecord) -> None:
        record.updated_at = time.time()
        path = self._path(record.worker_id)
        tmp = self.directory / f".{record.worker_id}{_SUFFIX}.{os.getpid()}.tmp"
        tmp.write_bytes(orjson.dumps(record.to_json()))
        os.replace(tmp, path)

    async def register(self, record: WorkerRecord) -> None:
        self._write(record)

    async def refresh(self, record: WorkerRecord) -> None:
        self._write(record)

    async def withdraw(self, worker_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(worker_id).unlink()

    # -- reads --------------------------------------------------------------------------------

    def _scan(self) -> list[WorkerRecord]:
        """Live records, sorted by worker id; deletes expired files; re-reads only changed files."""
        now = time.time()
        live: list[WorkerRecord] = []
        seen: set[str] = set()
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            entries = []
        for entry in entries:
            name = entry.name
            if name.startswith(".") or not name.endswith(_SUFFIX):
                continue
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue
            key = (st.st_mtime_ns, st.st_size, st.st_ino)
            cached = self._cache.get(name)
            if cached is not None and cached[0] == key:
                record = cached[1]
            else:
                record = self._read(entry.path)
                self._cache[name] = (key, record)
            seen.add(name)
            # An unreadable file ages out by its mtime; a record by its updated_at.
            stamp = record.updated_at if record is not None else st.st_mtime
            if now - stamp > self.ttl_s:
                self._delete_expired(entry.path, key)
                self._cache.pop(name, None)
                continue
            if record is not None:
                live.append(record)
        for name in list(self._cache):
            if name not in seen:
                del self._cache[name]
        live.sort(key=lambda r: r.worker_id)
        return live

    @staticmethod
    def _read(path: str) -> WorkerRecord | None:
        try:
            with open(path, "rb") as f:
                data = orjson.loads(f.read())
            return WorkerRecord.from_json(data)
        except (OSError, ValueError, TypeError):
            return None

    @staticmethod
    def _delete_expired(path: str, key: tuple[int, int, int]) -> None:
        """Delete an expired record unless it was rewritten since we looked (narrows the race
        with a heartbeat; a lost refresh is re-published by the next heartbeat anyway)."""
        try:
            st = os.stat(path)
            if (st.st_mtime_ns, st.st_size, st.st_ino) == key:
                os.unlink(path)
        except FileNotFoundError:
            pass

    async def list(self) -> builtins.list[WorkerRecord]:
        return self._scan()

    async def watch(self) -> AsyncIterator[builtins.list[WorkerRecord]]:
        """Yield the live set now, then each time it changes: a record added, removed, expired,
        or re-published with different content such as a new load sample (a heartbeat that only
        moves `updated_at` is not a change)."""
        last: builtins.list[dict] | None = None
        while True:
            records = self._scan()
            current = [{**r.to_json(), "updated_at": None} for r in records]
            if current != last:
                last = current
                yield records
            await asyncio.sleep(self.poll_s)
