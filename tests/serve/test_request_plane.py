"""The request plane on real loopback sockets, under asyncio and uvloop."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import socket
import statistics
import struct
import time
from collections.abc import AsyncIterator

import orjson
import pytest
import uvloop

from lab.serve.request_plane import (
    FrameType,
    RequestPlaneClient,
    RequestPlaneServer,
    StreamSink,
    WorkerUnavailable,
    error_end,
)
from lab.serve.request_plane.frames import (
    HEADER,
    MAX_PAYLOAD,
    FrameError,
    FrameReader,
    encode_frame,
)
from lab.shared.settings import SocketSettings
from launch.port_hold import PortHold
from tests.serve.tcp_peek import Sent, connections, nodelay, sent

CHUNK, END = int(FrameType.CHUNK), int(FrameType.END)


def both_loops(fn):
    """Run an async test body under asyncio and under uvloop (a sync test, parametrized)."""

    @pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
    def wrapper(loop_kind: str, **kwargs):
        factory = uvloop.new_event_loop if loop_kind == "uvloop" else asyncio.new_event_loop
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(fn(**kwargs))

    params = [inspect.Parameter("loop_kind", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += list(inspect.signature(fn).parameters.values())
    wrapper.__signature__ = inspect.Signature(params)
    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


def ok_end(n: int) -> dict:
    return {
        "finish": "length",
        "stop_reason": None,
        "usage": {"prompt_tokens": 1, "completion_tokens": n, "cached_tokens": 0},
        "handoff": None,
        "error": None,
        "worker_id": "w",
    }


async def counting_handler(request: dict, sink: StreamSink) -> None:
    """Streams request["n"] tokens, one chunk per loop iteration."""
    n = request["n"]
    for i in range(n):
        sink.chunk({"t": [request["base"] + i]})
        await asyncio.sleep(0)
    sink.end(ok_end(n))


async def collect(stream) -> tuple[list[int], dict, int]:
    tokens: list[int] = []
    chunks = 0
    end = None
    async for ftype, payload in stream:
        if ftype == CHUNK:
            tokens.extend(payload["t"])
            chunks += 1
        else:
            assert ftype == END
            end = payload
    assert end is not None
    return tokens, end, chunks


async def start_server(handler, settings: SocketSettings | None = None) -> RequestPlaneServer:
    server = RequestPlaneServer(handler, settings or SocketSettings())
    address = await server.start("127.0.0.1", 0)
    assert address.startswith("127.0.0.1:") and not address.endswith(":0")
    return server


@contextlib.asynccontextmanager
async def plane(
    handler,
    client_settings: SocketSettings | None = None,
    server_settings: SocketSettings | None = None,
) -> AsyncIterator[tuple[RequestPlaneServer, RequestPlaneClient]]:
    """A server of `handler` and a client of it, both closed at the end (a test may close either
    before: closing twice is harmless)."""
    server = await start_server(handler, server_settings)
    client = RequestPlaneClient(server.address, client_settings)
    try:
        yield server, client
    finally:
        await client.close()
        await server.close()


@both_loops
async def test_frames_roundtrip_and_limits() -> None:
    reader = FrameReader()
    data = encode_frame(1, 7, b'{"a":1}') + encode_frame(2, 8) + encode_frame(3, 9, b"[]")
    frames = []
    for i in range(len(data)):  # byte by byte
        frames += reader.feed(data[i : i + 1])
    assert frames == [(1, 7, b'{"a":1}'), (2, 8, b""), (3, 9, b"[]")]
    assert HEADER.size == 9
    with pytest.raises(FrameError, match="unknown frame type"):
        FrameReader().feed(struct.pack("!BII", 9, 1, 0))
    with pytest.raises(FrameError, match="exceeds"):
        FrameReader().feed(struct.pack("!BII", 3, 1, MAX_PAYLOAD + 1))


@both_loops
async def test_one_stream_end_to_end() -> None:
    async with plane(counting_handler) as (_, client):
        stream = await client.open_stream({"n": 5, "base": 100})
        tokens, end, _ = await collect(stream)
        assert tokens == [100, 101, 102, 103, 104]
        assert end["finish"] == "length" and end["usage"]["completion_tokens"] == 5
        assert stream.ended
        assert [x async for x in stream] == []  # ends after END


@both_loops
async def test_many_streams_multiplexed_on_the_pool() -> None:
    async with plane(counting_handler, SocketSettings(pool_size=2)) as (server, client):
        streams = [await client.open_stream({"n": 20, "base": i * 1000}) for i in range(40)]
        results = await asyncio.gather(*(collect(s) for s in streams))
        for i, (tokens, end, _) in enumerate(results):
            assert tokens == list(range(i * 1000, i * 1000 + 20))
            assert end["error"] is None
        with connections(server.address) as (clients, servers):
            assert len(clients) == 2 and len(servers) == 2
            before = {s.getsockname() for s in clients}
        # Persistent: more streams reuse the same two connections.
        await collect(await client.open_stream({"n": 1, "base": 0}))
        with connections(server.address) as (clients, _):
            assert {s.getsockname() for s in clients} == before


@both_loops
async def test_cancel_reaches_the_handler() -> None:
    seen_cancel = asyncio.Event()

    async def handler(request: dict, sink: StreamSink) -> None:
        sink.chunk({"t": [1]})
        await sink.cancelled.wait()
        seen_cancel.set()
        sink.end({**ok_end(1), "finish": "cancelled"})

    async with plane(handler) as (_, client):
        stream = await client.open_stream({})
        ftype, payload = await anext(stream)
        assert (ftype, payload) == (CHUNK, {"t": [1]})
        await stream.cancel()
        await stream.cancel()  # idempotent
        async with asyncio.timeout(5):
            ftype, payload = await anext(stream)
        assert ftype == END and payload["finish"] == "cancelled"
        assert seen_cancel.is_set()


@both_loops
async def test_connection_loss_ends_streams_unavailable_and_cancels_sinks() -> None:
    sinks: list[StreamSink] = []
    started = asyncio.Event()

    async def handler(request: dict, sink: StreamSink) -> None:
        sinks.append(sink)
        started.set()
        await sink.cancelled.wait()  # never ends on its own
        sink.end(error_end("cancelled", "gone", 499))

    async with plane(handler, SocketSettings(pool_size=1)) as (server, client):
        streams = [await client.open_stream({}) for _ in range(3)]
        await started.wait()
        await asyncio.sleep(0.05)
        with connections(server.address) as (_, servers):
            assert len(servers) == 1
            for sock in servers:  # the worker side drops the connection
                sock.shutdown(socket.SHUT_RDWR)
        async with asyncio.timeout(5):
            results = [await collect(s) for s in streams]
        for _, end, _ in results:
            assert end["error"]["kind"] == "unavailable"
            assert end["error"]["status"] == 503
        async with asyncio.timeout(5):
            while not all(s.cancelled.is_set() for s in sinks) or len(sinks) < 3:
                await asyncio.sleep(0.01)
        # The next open_stream reconnects.
        with connections(server.address) as (clients, _):
            assert clients == []
        sinks.clear()
        stream = await client.open_stream({})
        await started.wait()
        await stream.cancel()
        _, end, _ = await collect(stream)
        assert end["error"]["kind"] == "cancelled"


@both_loops
async def test_client_drop_cancels_the_sink() -> None:
    got: list[StreamSink] = []

    async def handler(request: dict, sink: StreamSink) -> None:
        got.append(sink)
        await sink.cancelled.wait()
        sink.end(error_end("cancelled", "client went away", 499))

    async with plane(handler) as (_, client):
        stream = await client.open_stream({})
        async with asyncio.timeout(5):
            while not got:
                await asyncio.sleep(0.01)
        await client.close()
        _, end, _ = await collect(stream)  # ends locally, unavailable
        assert end["error"]["kind"] == "unavailable"
        async with asyncio.timeout(5):
            await got[0].cancelled.wait()


@both_loops
async def test_server_close_ends_running_streams() -> None:
    async def handler(request: dict, sink: StreamSink) -> None:
        await asyncio.sleep(30)

    async with plane(handler) as (server, client):
        stream = await client.open_stream({})
        await asyncio.sleep(0.05)
        await server.close()
        async with asyncio.timeout(5):
            _, end, _ = await collect(stream)
        assert end["error"]["kind"] == "unavailable"


@both_loops
async def test_handler_failures_become_error_ends() -> None:
    async def handler(request: dict, sink: StreamSink) -> None:
        if request.get("mode") == "raise":
            raise RuntimeError("boom")
        # "forget": returns without END

    async with plane(handler) as (_, client):
        _, end, _ = await collect(await client.open_stream({"mode": "raise"}))
        assert end["error"]["kind"] == "engine_error" and "boom" in end["error"]["message"]
        _, end, _ = await collect(await client.open_stream({"mode": "forget"}))
        assert end["error"]["kind"] == "protocol"
        # Still serving after both.
        _, end, _ = await collect(await client.open_stream({"mode": "forget"}))
        assert end["error"]["kind"] == "protocol"


@both_loops
async def test_bad_request_payload_is_a_protocol_error() -> None:
    server = await start_server(counting_handler)
    try:
        reader, writer = await asyncio.open_connection(*server.address.split(":"))
        writer.write(encode_frame(1, 5, b"not json"))
        header = await reader.readexactly(9)
        ftype, sid, length = HEADER.unpack(header)
        payload = orjson.loads(await reader.readexactly(length))
        assert (ftype, sid) == (END, 5)
        assert payload["error"]["kind"] == "protocol"
        writer.close()
    finally:
        await server.close()


@both_loops
async def test_unreachable_worker_raises_worker_unavailable() -> None:
    with PortHold() as hold:  # bound, not listening: nothing listens there while held
        port = hold.port
        client = RequestPlaneClient(f"127.0.0.1:{port}")
        with pytest.raises(WorkerUnavailable, match=f"127.0.0.1:{port}"):
            await client.open_stream({})
        await client.close()
    with pytest.raises(ValueError, match="host:port"):
        RequestPlaneClient("nowhere")


class Sends:
    """What one side of the only connection to `address` sent since `start` (TCP_INFO: with
    TCP_NODELAY on loopback, each send() of a small payload is one data segment)."""

    def __init__(self, address: str, side: str) -> None:
        self.address = address
        self.side = side
        self._before = Sent(0, 0)

    def _now(self) -> Sent:
        with connections(self.address) as (clients, servers):
            (sock,) = clients if self.side == "client" else servers
            return sent(sock)

    def start(self) -> Sends:
        self._before = self._now()
        return self

    def since(self) -> Sent:
        return self._now() - self._before


NODELAY_ONE = SocketSettings(pool_size=1, client_nodelay=True, server_nodelay=True)


@both_loops
async def test_frames_of_one_iteration_leave_in_one_send() -> None:
    async def handler(request: dict, sink: StreamSink) -> None:
        # Three chunk() calls in one iteration: three CHUNK frames (never merged), then END.
        sink.chunk({"t": [1], "lp": [-0.1]})
        sink.chunk({"t": [2], "lp": [-0.2]})
        sink.chunk({"t": [3], "lp": [-0.3]})
        sink.end(ok_end(3))

    async with plane(handler, NODELAY_ONE, NODELAY_ONE) as (server, client):
        await collect(await client.open_stream({}))  # opens the connection
        csends = Sends(server.address, "client").start()
        ssends = Sends(server.address, "server").start()
        streams = [await client.open_stream({"i": i}) for i in range(5)]  # one iteration
        results = [await collect(s) for s in streams]
        for tokens, end, chunks in results:
            assert tokens == [1, 2, 3] and chunks == 3 and end["error"] is None
        assert csends.since().segments == 1  # five REQUEST frames, one send()
        assert ssends.since().segments == 1  # five (3 CHUNKs + END), one send()
        stream = await client.open_stream({})
        payloads = [p for f, p in [x async for x in stream] if f == CHUNK]
        assert payloads == [{"t": [1], "lp": [-0.1]}, {"t": [2], "lp": [-0.2]},
                            {"t": [3], "lp": [-0.3]}]


@both_loops
async def test_split_writes_send_header_then_body() -> None:
    settings = SocketSettings(pool_size=1, split_writes=True, client_nodelay=True)
    async with plane(counting_handler, settings) as (server, client):
        await collect(await client.open_stream({"n": 1, "base": 0}))
        sends = Sends(server.address, "client").start()
        body = orjson.dumps({"n": 3, "base": 7})
        stream = await client.open_stream({"n": 3, "base": 7})
        assert sends.since() == Sent(2, 9 + len(body))  # two syscalls, at once (not deferred)
        tokens, _end, _ = await collect(stream)
        assert tokens == [7, 8, 9]
        # A CANCEL queued before a split REQUEST keeps its order (flushed first).
        slow = await client.open_stream({"n": 1000000, "base": 0})
        await slow.cancel()
        sends.start()
        stream = await client.open_stream({"n": 2, "base": 0})
        assert sends.since() == Sent(3, 9 + 9 + len(orjson.dumps({"n": 2, "base": 0})))
        await collect(stream)


@both_loops
async def test_coalesced_requests_are_one_send_by_default() -> None:
    async with plane(counting_handler, NODELAY_ONE) as (server, client):
        await collect(await client.open_stream({"n": 1, "base": 0}))
        sends = Sends(server.address, "client").start()
        stream = await client.open_stream({"n": 1, "base": 0})
        assert sends.since() == Sent(0, 0)  # deferred to the loop-iteration flush
        await collect(stream)
        assert sends.since() == Sent(1, 9 + len(orjson.dumps({"n": 1, "base": 0})))


@pytest.mark.parametrize("client_nodelay", [True, False])
@pytest.mark.parametrize("server_nodelay", [True, False])
@both_loops
async def test_nodelay_settings_reach_the_sockets(
    client_nodelay: bool, server_nodelay: bool
) -> None:
    settings = SocketSettings(
        client_nodelay=client_nodelay, server_nodelay=server_nodelay, pool_size=3
    )
    async with plane(counting_handler, settings, settings) as (server, client):
        streams = [await client.open_stream({"n": 2, "base": 0}) for _ in range(3)]
        for s in streams:
            await collect(s)
        with connections(server.address) as (clients, servers):
            assert len(clients) == 3 and len(servers) == 3
            assert [nodelay(s) for s in clients] == [client_nodelay] * 3
            assert [nodelay(s) for s in servers] == [server_nodelay] * 3


@both_loops
async def test_backpressure_keeps_every_chunk_its_own_frame() -> None:
    """A reader that does not read: the kernel buffers fill, the frames wait in the backlog,
    and every chunk still arrives as its own frame, in order."""
    n = 3000
    done = asyncio.Event()

    async def handler(request: dict, sink: StreamSink) -> None:
        for i in range(n):
            sink.chunk({"t": [i], "lp": [0.5] * 1500})
            await asyncio.sleep(0)
        sink.end(ok_end(n))
        done.set()

    server = await start_server(handler)
    try:
        host, port = server.address.split(":")
        reader, writer = await asyncio.open_connection(host, int(port), limit=2**26)
        writer.transport.pause_reading()
        body = orjson.dumps({})
        writer.write(encode_frame(1, 1, body))
        async with asyncio.timeout(20):
            await done.wait()
        writer.transport.resume_reading()
        tokens: list[int] = []
        frames = 0
        async with asyncio.timeout(20):
            while True:
                ftype, _sid, length = HEADER.unpack(await reader.readexactly(9))
                payload = orjson.loads(await reader.readexactly(length))
                if ftype == END:
                    break
                frames += 1
                tokens.extend(payload["t"])
        assert tokens == list(range(n))
        assert frames == n  # one frame per chunk, even while blocked
        writer.close()
    finally:
        await server.close()


async def _median_second_request_ms(settings: SocketSettings, n: int = 7) -> float:
    async def handler(request: dict, sink: StreamSink) -> None:
        sink.end(ok_end(0))

    async with plane(handler, settings, settings) as (_, client):
        await collect(await client.open_stream({"pad": "x" * 200}))  # request #1: always fast
        times = []
        for _ in range(n):
            await asyncio.sleep(0.005)
            started = time.perf_counter()
            await collect(await client.open_stream({"pad": "x" * 200}))
            times.append((time.perf_counter() - started) * 1000)
        return statistics.median(times)


@pytest.mark.kernel_delayed_ack
@both_loops
async def test_split_writes_without_client_nodelay_stall_on_a_persistent_connection() -> None:
    """The behaviour the settings exist for (docs/nagle.md): header+body writes with Nagle on
    the client wait for the server's delayed ACK (~40 ms); one coalesced write does not."""
    base = {"pool_size": 1, "server_nodelay": True}
    stalled = await _median_second_request_ms(
        SocketSettings(client_nodelay=False, split_writes=True, **base)
    )
    coalesced = await _median_second_request_ms(
        SocketSettings(client_nodelay=False, split_writes=False, **base)
    )
    nodelay = await _median_second_request_ms(
        SocketSettings(client_nodelay=True, split_writes=True, **base)
    )
    assert stalled > 25, (stalled, coalesced, nodelay)
    assert coalesced < stalled / 3 and nodelay < stalled / 3, (stalled, coalesced, nodelay)


@both_loops
async def test_an_oversized_request_is_refused_without_breaking_the_connection() -> None:
    """A request over the frame limit must not reach the wire: the worker would drop the whole
    connection, and every other stream multiplexed on it."""
    seen: list[int] = []

    async def slow_handler(request: dict, sink: StreamSink) -> None:
        seen.append(len(request.get("pad", "")))
        for i in range(request["n"]):
            sink.chunk({"t": [i]})
            await asyncio.sleep(0.01)
        sink.end(ok_end(request["n"]))

    async with plane(slow_handler, SocketSettings(pool_size=1)) as (_, client):
        running = await client.open_stream({"n": 20})
        await anext(running)  # in flight on the (only) connection
        big = await client.open_stream({"n": 1, "pad": "x" * (MAX_PAYLOAD + 10)})
        _, end, _ = await collect(big)
        assert end["error"]["kind"] == "invalid_request" and end["error"]["status"] == 413
        tokens, end, _ = await collect(running)
        assert end["error"] is None and len(tokens) == 19  # the other stream was not hurt
        assert seen == [0]  # the oversized request never reached the worker


@both_loops
async def test_an_undecodable_frame_ends_the_streams_instead_of_hanging_them() -> None:
    async def bad_worker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(2):  # two requests arrive; answer the first with garbage
            header = await reader.readexactly(HEADER.size)
            await reader.readexactly(HEADER.unpack(header)[2])
        writer.write(HEADER.pack(CHUNK, 1, 3) + b"{{{")
        await writer.drain()
        await asyncio.sleep(5)

    server = await asyncio.start_server(bad_worker, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = RequestPlaneClient(f"127.0.0.1:{port}", SocketSettings(pool_size=1))
    try:
        first = await client.open_stream({"n": 1})
        second = await client.open_stream({"n": 1})
        async with asyncio.timeout(5):
            _, end1, _ = await collect(first)
            _, end2, _ = await collect(second)
        assert end1["error"]["kind"] == "unavailable" and "undecodable" in end1["error"]["message"]
        assert end2["error"]["kind"] == "unavailable"
    finally:
        await client.close()
        server.close()


@both_loops
async def test_direct_chunks_keep_their_order_with_queued_ones() -> None:
    """A stream's `direct` callback takes CHUNKs as they arrive; once it declines one, that one
    and every later frame go through the iterator, in order, until the queue is empty again."""

    async def handler(request: dict, sink: StreamSink) -> None:
        for i in range(6):
            sink.chunk({"t": [i]})
        sink.end(ok_end(6))

    taken: list[int] = []
    async with plane(handler) as (_, client):
        stream = await client.open_stream({})

        def direct(p: dict) -> bool:
            if p["t"][0] == 2:
                return False  # e.g. the consumer's socket is full
            taken.append(p["t"][0])
            return True

        stream.direct = direct
        rest = [(f, p) async for f, p in stream]
        assert taken == [0, 1]  # 3, 4, 5 arrived while 2 was still queued
        assert [p["t"][0] for f, p in rest if f == CHUNK] == [2, 3, 4, 5]
        assert rest[-1][0] == END
