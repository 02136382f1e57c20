"""The load client's HTTP/1.1 layer: chunked framing under any split of the bytes into reads,
arrival stamps per read, SSE event splitting, and the response kinds it must handle."""

from __future__ import annotations

import asyncio
import itertools
import socket
from collections.abc import AsyncIterator, Iterator

import orjson
import pytest

from lab.load import http1
from lab.load.client import run_level
from lab.load.client_settings import ClientSettings
from lab.load.http1 import Http1Connection, Origin, connect
from lab.load.sse import RawResponse, parse_response, split_events
from lab.load.workload import WorkloadSpec, build_requests
from tests.bench.fake_sse import serve


class _Transport:
    def __init__(self) -> None:
        self.closed = False
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> None:
        return None


def _event(text: str, **extra: object) -> bytes:
    obj = {"id": "cmpl-1", "choices": [{"index": 0, "text": text, "finish_reason": None}],
           **extra}
    return b"data: " + orjson.dumps(obj) + b"\n\n"


EVENTS = [_event(""), _event("a "), _event("b "), _event("c "),
          b"data: " + orjson.dumps({"id": "cmpl-1", "choices": [], "usage": {
              "prompt_tokens": 3, "completion_tokens": 3}}) + b"\n\n",
          b"data: [DONE]\n\n"]
BODY = b"".join(EVENTS)
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def _chunked(parts: list[bytes], trailer: bytes = b"") -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n" + trailer + b"\r\n"


def _odd_chunks() -> list[bytes]:
    """Chunk boundaries that cut SSE events (and their blank-line terminators) anywhere."""
    cuts = [0, 7, 30, 31, 95, 96, 97, 150, len(BODY) - 1, len(BODY)]
    return [BODY[a:b] for a, b in itertools.pairwise(cuts) if b > a]


class _Clock:
    def __init__(self) -> None:
        self.t = 0

    def __call__(self) -> int:
        self.t += 1
        return self.t * 1000


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Clock]:
    c = _Clock()
    monkeypatch.setattr(http1.time, "perf_counter_ns", c)
    yield c


def _feed(reads: list[bytes], streaming: bool = True
          ) -> tuple[Http1Connection, RawResponse, list[bool]]:
    conn = Http1Connection()
    conn.connection_made(_Transport())  # type: ignore[arg-type]
    raw = RawResponse(sent_ns=0)
    done: list[bool] = []
    conn.request(b"POST / HTTP/1.1\r\n\r\n", raw, streaming,
                 lambda _c, _r, reusable: done.append(reusable))
    for data in reads:
        conn.data_received(data)
    return conn, raw, done


def _splits(data: bytes) -> Iterator[list[bytes]]:
    """Every way to cut `data` into two reads, and a few three-read cuts."""
    for i in range(1, len(data)):
        yield [data[:i], data[i:]]
    for i in range(1, len(data) - 1, 7):
        for j in (i + 1, i + 2, i + 13):
            if j < len(data):
                yield [data[:i], data[i:j], data[j:]]


@pytest.mark.parametrize("trailer", [b"", b"X-Trailer: 1\r\n"])
def test_chunked_any_split_gives_the_body_and_completes_once(clock: _Clock,
                                                             trailer: bytes) -> None:
    wire = HEAD + _chunked(_odd_chunks(), trailer)
    for reads in itertools.chain([[wire], [bytes([b]) for b in wire]], _splits(wire)):
        conn, raw, done = _feed(reads)
        assert done == [True], reads
        assert raw.status == 200 and raw.error_kind is None
        assert b"".join(raw.pieces) == BODY, reads
        assert len(raw.times) == len(raw.pieces)
        assert raw.times == sorted(raw.times)
        _, events = split_events(raw.times, raw.pieces)
        assert [e + b"\n\n" for e in events] == EVENTS, reads
        assert not conn.closed


def test_crlf_after_chunk_data_split_across_reads(clock: _Clock) -> None:
    wire = HEAD + _chunked([EVENTS[1], EVENTS[2]])
    cr = len(HEAD) + len(b"%x\r\n" % len(EVENTS[1])) + len(EVENTS[1])  # CRLF ending chunk 1
    assert wire[cr - 2:cr + 2] == b"\n\n\r\n"
    _, raw, done = _feed([wire[:cr + 1], wire[cr + 1:]])  # ...\r | \n...
    assert done == [True] and b"".join(raw.pieces) == EVENTS[1] + EVENTS[2]
    size_cr = wire.index(b"\r\n", len(HEAD))  # the CRLF ending the first size line
    _, raw, done = _feed([wire[:size_cr + 1], wire[size_cr + 1:]])
    assert done == [True] and b"".join(raw.pieces) == EVENTS[1] + EVENTS[2]


def test_events_take_the_stamp_of_the_read_that_completed_them(clock: _Clock) -> None:
    e1, e2, e3 = EVENTS[1], EVENTS[2], EVENTS[3]
    # read 1: head + e1 whole + half of e2; read 2: rest of e2 + e3 + end (one read, 2 events)
    half = len(e2) // 2
    reads = [HEAD + _chunked([e1, e2[:half]])[:-5], _chunked([e2[half:], e3])]
    _, raw, done = _feed(reads)
    assert done == [True]
    times, events = split_events(raw.times, raw.pieces, raw.done_ns)
    assert [e + b"\n\n" for e in events] == [e1, e2, e3]
    assert times == [1000, 2000, 2000]
    rec = parse_response(raw, True)
    assert rec.chunk_times_ns == [1000, 2000, 2000] and rec.chunks == 3
    assert rec.error_kind == "incomplete"  # no [DONE] in this stream


@pytest.mark.parametrize("crlf", [False, True])
def test_event_split_inside_its_terminator_takes_the_later_stamp(crlf: bool) -> None:
    body = BODY.replace(b"\n", b"\r\n") if crlf else BODY
    end = body.index(b"\n\n" if not crlf else b"\r\n\r\n")  # the first event's terminator
    for i in range(end, end + (4 if crlf else 2)):  # every cut inside the terminator
        times, events = split_events([10, 20], [body[:i], body[i:]])
        assert times[0] == 20 and events[0] + b"\n\n" == EVENTS[0], i
    times, _ = split_events([10, 20], [body[:end + 2], body[end + 2:]])
    assert times[0] == (20 if crlf else 10)


def test_sse_crlf_line_endings_split_across_pieces() -> None:
    body = BODY.replace(b"\n", b"\r\n")
    for i in range(1, len(body)):
        times, events = split_events([1, 2], [body[:i], body[i:]])
        assert [e + b"\n\n" for e in events] == EVENTS, i
        assert times == sorted(times)


def test_chunk_extensions_uppercase_hex_and_interim_response(clock: _Clock) -> None:
    big = BODY * 3  # over 255 bytes: a multi-digit size
    wire = (b"HTTP/1.1 100 Continue\r\n\r\n" + HEAD
            + b"%X;name=value\r\n%s\r\n0\r\n\r\n" % (len(big), big))
    _, raw, done = _feed([wire])
    assert done == [True] and raw.status == 200 and b"".join(raw.pieces) == big


def test_content_length_close_delimited_and_connection_close(clock: _Clock) -> None:
    body = b'{"error": {"message": "no worker", "type": "unavailable"}}'
    head = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: %d\r\n\r\n" % len(body)
    conn, raw, done = _feed([head + body[:10], body[10:]])
    assert done == [True] and raw.status == 503 and raw.body == body and not raw.pieces
    rec = parse_response(raw, True)
    assert rec.error_kind == "http_503" and "no worker" in rec.error_message

    head = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n"
    conn, raw, done = _feed([head + b"{}"], streaming=False)
    assert done == [False] and raw.body == b"{}" and conn.closed

    conn, raw, done = _feed([b"HTTP/1.0 200 OK\r\n\r\n" + BODY[:50], BODY[50:]])
    assert done == []  # read until close
    conn.connection_lost(None)
    assert done == [False] and b"".join(raw.pieces) == BODY and raw.error_kind is None


@pytest.mark.parametrize("wire,kind", [
    (HEAD + b"zz\r\n", "protocol"),  # a size that is not hex
    (HEAD + b"3\r\nabcXY", "protocol"),  # chunk data not followed by CRLF
    (b"SPDY/3 200 OK\r\n\r\n", "protocol"),  # not an HTTP/1.x status line
])
def test_malformed_responses_are_protocol_errors(clock: _Clock, wire: bytes, kind: str) -> None:
    conn, raw, done = _feed([wire])
    assert done == [False] and raw.error_kind == kind and conn.closed


def test_connection_lost_mid_stream_is_a_disconnect(clock: _Clock) -> None:
    conn, raw, done = _feed([HEAD + _chunked([EVENTS[1]])[:-5]])
    conn.connection_lost(ConnectionResetError("reset"))
    assert done == [False] and raw.error_kind == "disconnect"
    assert b"".join(raw.pieces) == EVENTS[1]  # what arrived is kept (its tokens count)


# ----- real sockets -----

class _Scripted:
    """A server that answers each request with `reads` (written with pauses in between, so the
    client sees them as separate reads), then keeps the connection open."""

    def __init__(self, reads: list[bytes]) -> None:
        self.reads = reads

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                for data in self.reads:
                    writer.write(data)
                    await writer.drain()
                    await asyncio.sleep(0.02)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def scripted() -> AsyncIterator[tuple[_Scripted, str]]:
    s = _Scripted([])
    server = await asyncio.start_server(s.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield s, f"http://127.0.0.1:{port}"


def _bodies(n: int, osl: int = 3, stream: bool = True) -> list[dict]:
    return build_requests(WorkloadSpec(isl=4, osl=osl, stream=stream), "fake", n, level_seed=1)


async def test_split_chunks_over_real_reads(scripted: tuple[_Scripted, str]) -> None:
    s, url = scripted
    wire = HEAD + _chunked(_odd_chunks())
    # cut between the CR and LF ending the first chunk, and inside each token's event
    first_cr = len(HEAD) + len(b"7\r\n") + 7
    assert wire[first_cr:first_cr + 2] == b"\r\n"
    cuts = [0, first_cr + 1, *(wire.index(b'"%s "' % t) + 2 for t in (b"a", b"b", b"c")),
            len(wire)]
    s.reads = [wire[a:b] for a, b in itertools.pairwise(cuts)]
    res = await run_level(url, _bodies(3), 1)
    for r in res.records:
        assert r.ok, r
        assert r.chunks == 3 and r.output_tokens == 3
        times = r.chunk_times_ns
        assert times == sorted(times) and times[-1] > times[0]  # not all in one read
    assert len({r.sent_ns for r in res.records}) == 3


async def test_timeout_is_a_row(scripted: tuple[_Scripted, str]) -> None:
    s, url = scripted
    s.reads = [HEAD + _chunked([EVENTS[1]])[:-5]]  # one token, then nothing more
    res = await run_level(url, _bodies(2), 2,
        options=ClientSettings(in_process_client=True, timeout=0.3))
    assert [r.error_kind for r in res.records] == ["timeout", "timeout"]
    assert all(r.chunks == 1 for r in res.records)


@pytest.fixture
async def fast_sse() -> AsyncIterator[str]:
    stop = asyncio.Event()
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(serve("127.0.0.1", 0, stop, on_ready=ready.set_result))
    yield "http://" + await asyncio.wait_for(ready, 10)
    stop.set()
    await task


async def test_non_streaming_json_response(fast_sse: str) -> None:
    res = await run_level(fast_sse, _bodies(4, osl=5, stream=False), 2)
    for r in res.records:
        assert r.ok, r
        assert r.output_tokens == 5 and r.output_tokens_source == "usage"
        assert r.chunks == 1 and r.first_ns == r.done_ns


async def test_one_chunk_per_token_stream(fast_sse: str) -> None:
    res = await run_level(fast_sse, _bodies(20, osl=64), 4)
    assert all(r.ok and r.chunks == 64 and r.output_tokens == 64 for r in res.records)
    assert all(r.decode_worker_id == "fake-sse" for r in res.records)


@pytest.mark.parametrize("nodelay", [True, False])
async def test_nodelay_is_set_either_way(fast_sse: str, nodelay: bool) -> None:
    conn = await connect(Origin.from_url(fast_sse + "/v1/completions"), nodelay=nodelay)
    try:
        sock = conn.transport.get_extra_info("socket")  # type: ignore[union-attr]
        assert bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)) is nodelay
    finally:
        conn.close()


def test_origin_from_url() -> None:
    o = Origin.from_url("http://localhost:8000/v1/completions?x=1")
    assert (o.host, o.port, o.target, o.host_header) == ("localhost", 8000,
                                                         "/v1/completions?x=1", "localhost:8000")
    assert Origin.from_url("https://api.example/v1/chat/completions").port == 443
    with pytest.raises(ValueError, match="http"):
        Origin.from_url("ftp://x/v1/completions")
