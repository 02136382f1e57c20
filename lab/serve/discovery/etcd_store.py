"""The networked registry: etcd v3, spoken through its JSON gateway over HTTP (aiohttp).

    etcd://HOST:PORT[/prefix]      default prefix /loadlab/workers/

Layout: one key per worker, `<prefix><worker_id>`, whose value is the record's JSON. Each key is
attached to its own lease (TTL = the registry's ttl, rounded up to whole seconds). `refresh()`
(the sidecar's heartbeat) keeps the lease alive and re-publishes the record only when its
content changed (a new load sample): a heartbeat that changes nothing is one keepalive and no
watch event at all. A sidecar killed with SIGKILL disappears when its lease runs out, with no
cleanup code running anywhere. When a keepalive finds the lease already gone (the process
stalled for longer than the TTL, or etcd lost it), refresh grants a new lease and puts the
record again. `withdraw()` deletes the key and revokes the lease.

`watch_changes()` (what the frontend follows) ranges the prefix, yields the live set (a reset),
then follows the `/v3/watch` stream from the next revision and yields each watch message's
changes: the records it added or changed and the ids it removed, found by looking up the one key
each event names, so an event costs the same at 10 workers as at 10,000 (a put that only moves
`updated_at` is not a change, as in the file store). When the stream breaks or cannot be opened
it falls back to polling: wait `poll_s`, range again (a reset if the set differs), and
reconnect. `watch()` folds those changes into whole sets for callers that want them.

Only the gateway's documented endpoints are used (kv/put, kv/range, kv/deleterange,
lease/grant, lease/keepalive, lease/revoke, watch); keys and values travel base64-encoded. No
etcd client library: the maintained ones do not exist for asyncio and the old ones break on
current protobuf.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import contextlib
import logging
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from lab.serve.discovery.base import Changes, Registry, WorkerRecord
from lab.shared.settings import DiscoveryTiming

log = logging.getLogger("lab.discovery.etcd")

DEFAULT_PREFIX = "/loadlab/workers/"
DEFAULT_REQUEST_TIMEOUT_S = 5.0
DEFAULT_POLL_S = 1.0


class EtcdError(OSError):
    """etcd answered with an error, or could not be reached. The message names the URL.

    An OSError, so callers that treat a failed heartbeat or list as transient keep doing so.
    """


class EtcdUnavailable(EtcdError):
    """No connection to etcd (refused, reset, timed out)."""


def parse_etcd_spec(spec: str) -> tuple[str, str]:
    """`etcd://HOST:PORT[/prefix]` -> (base URL "http://HOST:PORT", key prefix ending in "/").

    ValueError naming the spec when it is malformed.
    """
    if not spec.startswith("etcd://"):
        raise ValueError(f"--discovery {spec!r}: expected etcd://HOST:PORT[/prefix] (or file:DIR)")
    parts = urlsplit("http://" + spec[len("etcd://") :])
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None or parts.query or parts.fragment:
        raise ValueError(f"--discovery {spec!r}: expected etcd://HOST:PORT[/prefix] (or file:DIR)")
    host = parts.hostname
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    path = parts.path.strip("/")
    prefix = f"/{path}/" if path else DEFAULT_PREFIX
    return f"http://{netloc}", prefix


def _b64(data: str | bytes) -> str:
    if isinstance(data, str):
        data = data.encode()
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


def prefix_range_end(prefix: str) -> bytes:
    """The etcd range end that selects every key starting with `prefix`."""
    raw = bytearray(prefix.encode())
    while raw:
        if raw[-1] < 0xFF:
            raw[-1] += 1
            return bytes(raw)
        raw.pop()
    return b"\0"  # all keys


def _check_worker_id(worker_id: str) -> str:
    if not worker_id or "/" in worker_id or "\0" in worker_id:
        raise ValueError(f"worker id {worker_id!r}: must be non-empty and contain no '/'")
    return worker_id


def _same_state(a: dict[bytes, WorkerRecord], b: dict[bytes, WorkerRecord]) -> bool:
    return a.keys() == b.keys() and all(a[k].same_content(b[k]) for k in a)


def _by_id(records: builtins.list[WorkerRecord]) -> builtins.list[WorkerRecord]:
    return sorted(records, key=lambda r: r.worker_id)


class EtcdRegistry(Registry):
    """`etcd://HOST:PORT[/prefix]`: see the module docstring."""

    def __init__(
        self,
        url: str,
        prefix: str = DEFAULT_PREFIX,
        ttl_s: float = DiscoveryTiming.ttl_s,
        poll_s: float = DEFAULT_POLL_S,
        request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s {ttl_s!r}: must be > 0")
        if poll_s <= 0:
            raise ValueError(f"poll_s {poll_s!r}: must be > 0")
        if not prefix.startswith("/") or not prefix.endswith("/"):
            raise ValueError(f"etcd prefix {prefix!r}: must start and end with '/'")
        self.url = url.rstrip("/")
        self.prefix = prefix
        self.ttl_s = float(ttl_s)
        self.lease_ttl = max(1, math.ceil(ttl_s))  # etcd leases have whole-second TTLs
        self.poll_s = float(poll_s)
        self.request_timeout_s = float(request_timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._leases: dict[str, int] = {}  # worker id -> lease id (records this registry owns)
        self._published: dict[str, WorkerRecord] = {}  # worker id -> what its last put wrote

    @classmethod
    def from_spec(cls, spec: str, **options: Any) -> EtcdRegistry:
        url, prefix = parse_etcd_spec(spec)
        return cls(url, prefix, **options)

    @property
    def spec(self) -> str:
        return f"etcd://{self.url.removeprefix('http://')}{self.prefix.rstrip('/')}"

    # -- HTTP ---------------------------------------------------------------------------------

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, force_close=False),
                json_serialize=lambda obj: orjson.dumps(obj).decode(),
            )
        return self._session

    async def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST one gateway request; returns the decoded JSON answer or raises EtcdError."""
        url = self.url + path
        timeout = aiohttp.ClientTimeout(total=self.request_timeout_s)
        try:
            async with self._http().post(url, data=orjson.dumps(body), timeout=timeout) as resp:
                raw = await resp.read()
                status = resp.status
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            raise EtcdUnavailable(
                f"etcd at {self.url} is unreachable ({path}): {exc or type(exc).__name__}"
            ) from exc
        try:
            answer = orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError as exc:
            raise EtcdError(
                f"etcd at {self.url} answered {path} with HTTP {status} and non-JSON "
                f"{raw[:200]!r}: is this an etcd v3 client URL?"
            ) from exc
        if status != 200 or (isinstance(answer, dict) and "error" in answer and "code" in answer):
            message = (
                (answer.get("message") or answer.get("error"))
                if isinstance(answer, dict)
                else raw.decode(errors="replace")
            )
            raise EtcdError(f"etcd at {self.url} refused {path} (HTTP {status}): {message}")
        return answer

    # -- leases -------------------------------------------------------------------------------

    async def _grant(self) -> int:
        answer = await self._call("/v3/lease/grant", {"TTL": self.lease_ttl})
        return int(answer["ID"])

    async def _keepalive(self, lease: int) -> bool:
        """One keepalive; False when the lease no longer exists (expired or revoked)."""
        answer = await self._call("/v3/lease/keepalive", {"ID": str(lease)})
        result = answer.get("result", answer)
        return int(result.get("TTL", 0) or 0) > 0

    async def _revoke(self, lease: int) -> None:
        try:
            await self._call("/v3/lease/revoke", {"ID": str(lease)})
        except EtcdUnavailable:
            raise
        except EtcdError as exc:  # already expired: nothing to revoke
            if "not found" not in str(exc):
                raise

    async def _put(self, record: WorkerRecord, lease: int) -> None:
        record.updated_at = time.time()
        self._published.pop(record.worker_id, None)
        await self._call(
            "/v3/kv/put",
            {
                "key": _b64(self.prefix + record.worker_id),
                "value": _b64(orjson.dumps(record.to_json())),
                "lease": str(lease),
            },
        )
        # A copy: the caller keeps mutating its record (a new load sample each heartbeat).
        self._published[record.worker_id] = replace(record, load=dict(record.load))

    # -- Registry -----------------------------------------------------------------------------

    async def register(self, record: WorkerRecord) -> None:
        _check_worker_id(record.worker_id)
        old = self._leases.pop(record.worker_id, None)
        lease = await self._grant()
        self._leases[record.worker_id] = lease
        await self._put(record, lease)
        if old is not None:
            with contextlib.suppress(EtcdError):
                await self._revoke(old)

    async def refresh(self, record: WorkerRecord) -> None:
        """Keep the lease alive and re-publish the record if its content changed (a new load
        sample); unchanged, the keepalive is all (no watch event). A lease that is gone (or a
        refresh before any register) gets a fresh lease: the record reappears."""
        _check_worker_id(record.worker_id)
        lease = self._leases.get(record.worker_id)
        if lease is None or not await self._keepalive(lease):
            if lease is not None:
                log.warning(
                    "etcd lease of %s expired before its heartbeat; registering again",
                    record.worker_id,
                )
            await self.register(record)
            return
        published = self._published.get(record.worker_id)
        if published is not None and published.same_content(record):
            return
        await self._put(record, lease)

    async def withdraw(self, worker_id: str) -> None:
        _check_worker_id(worker_id)
        await self._call("/v3/kv/deleterange", {"key": _b64(self.prefix + worker_id)})
        self._published.pop(worker_id, None)
        lease = self._leases.pop(worker_id, None)
        if lease is not None:
            await self._revoke(lease)

    async def _range(self) -> tuple[dict[bytes, WorkerRecord], int]:
        """Every record under the prefix, by key, and the store revision it was read at."""
        answer = await self._call(
            "/v3/kv/range",
            {"key": _b64(self.prefix), "range_end": _b64(prefix_range_end(self.prefix))},
        )
        revision = int(answer.get("header", {}).get("revision", 0))
        records: dict[bytes, WorkerRecord] = {}
        for kv in answer.get("kvs", []):
            record = self._decode(kv)
            if record is not None:
                records[_unb64(kv["key"])] = record
        return records, revision

    @staticmethod
    def _decode(kv: dict[str, Any]) -> WorkerRecord | None:
        try:
            return WorkerRecord.from_json(orjson.loads(_unb64(kv.get("value", ""))))
        except (ValueError, TypeError):
            log.warning("ignoring an unreadable record at key %r", kv.get("key"))
            return None

    async def list(self) -> builtins.list[WorkerRecord]:
        records, _ = await self._range()
        return _by_id(list(records.values()))

    async def watch(self) -> AsyncIterator[builtins.list[WorkerRecord]]:
        """Yield the live set now, then each time it changes: `watch_changes` folded into whole
        sets (O(N) per change; the frontend follows `watch_changes` itself)."""
        live: dict[str, WorkerRecord] = {}
        async for change in self.watch_changes():
            if change.reset:
                live = {}
            for record in change.records:
                live[record.worker_id] = record
            for worker_id in change.removed:
                live.pop(worker_id, None)
            yield _by_id(list(live.values()))

    async def watch_changes(self) -> AsyncIterator[Changes]:
        """The live set now, then each change (see the module docstring).

        Never raises for an unreachable etcd: it logs (once per outage) and keeps retrying every
        `poll_s`, yielding a reset as soon as the set is readable and differs.
        """
        known: dict[bytes, WorkerRecord] | None = None
        outage: str | None = None
        while True:
            try:
                state, revision = await self._range()
            except EtcdError as exc:
                if outage is None:
                    log.warning("discovery: %s; retrying every %.1fs", exc, self.poll_s)
                outage = str(exc)
                await asyncio.sleep(self.poll_s)
                continue
            if outage is not None:
                log.info("discovery: etcd at %s is reachable again", self.url)
                outage = None
            if known is None or not _same_state(known, state):
                yield Changes(tuple(_by_id(list(state.values()))), reset=True)
            known = state
            try:
                async with contextlib.aclosing(self._follow(state, revision + 1)) as changes:
                    async for change in changes:
                        yield change
            except (EtcdError, aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
                log.warning(
                    "discovery: etcd watch stream broke (%s); polling, then reconnecting", exc
                )
            await asyncio.sleep(self.poll_s)

    async def _follow(
        self, state: dict[bytes, WorkerRecord], start_revision: int
    ) -> AsyncGenerator[Changes, None]:
        """Apply /v3/watch events to `state` from `start_revision`; yield each message's
        changes (none: nothing is yielded). Each event touches the one key it names. Returns
        when the stream ends or etcd cancels the watch."""
        body = {
            "create_request": {
                "key": _b64(self.prefix),
                "range_end": _b64(prefix_range_end(self.prefix)),
                "start_revision": str(start_revision),
            }
        }
        url = self.url + "/v3/watch"
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.request_timeout_s)
        try:
            resp_cm = self._http().post(url, data=orjson.dumps(body), timeout=timeout)
            async with resp_cm as resp:
                if resp.status != 200:
                    text = (await resp.read())[:200]
                    raise EtcdError(
                        f"etcd at {self.url} refused /v3/watch (HTTP {resp.status}): {text!r}"
                    )
                buffer = b""
                async for chunk in resp.content.iter_any():
                    buffer += chunk
                    while b"\n" in buffer:
                        line, buffer = buffer.split(b"\n", 1)
                        if not line.strip():
                            continue
                        message = orjson.loads(line)
                        if "error" in message:
                            raise EtcdError(f"etcd at {self.url} /v3/watch: {message['error']}")
                        result = message.get("result", {})
                        if result.get("canceled") or result.get("compact_revision"):
                            reason = result.get("cancel_reason") or "compacted"
                            raise EtcdError(f"etcd at {self.url} cancelled the watch: {reason}")
                        events = result.get("events")
                        if not events:
                            continue
                        changed: dict[str, WorkerRecord | None] = {}  # None: removed
                        for event in events:
                            kv = event.get("kv", {})
                            key = _unb64(kv.get("key", ""))
                            old = state.get(key)
                            if event.get("type") == "DELETE":
                                if old is not None:
                                    del state[key]
                                    changed[old.worker_id] = None
                                continue
                            record = self._decode(kv)
                            if record is None:
                                continue
                            state[key] = record
                            if old is None or not old.same_content(record):
                                changed[record.worker_id] = record
                        if changed:
                            yield Changes(
                                tuple(r for r in changed.values() if r is not None),
                                tuple(w for w, r in changed.items() if r is None),
                            )
        except aiohttp.ClientConnectionError as exc:
            raise EtcdUnavailable(f"etcd at {self.url} is unreachable (/v3/watch): {exc}") from exc

    async def close(self) -> None:
        """Revoke the leases this registry still holds (their records vanish at once) and close
        the HTTP session. Errors are logged, not raised: close runs on the way out."""
        for worker_id, lease in list(self._leases.items()):
            try:
                await self._revoke(lease)
            except EtcdError as exc:
                log.warning("could not revoke the etcd lease of %s: %s", worker_id, exc)
        self._leases.clear()
        self._published.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None
