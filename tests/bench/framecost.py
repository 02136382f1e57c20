"""Per-DATA-frame cost: the `h2` library vs h2grpc's hand-written framing (timeit).

    python -m tests.bench.framecost      (needs `h2`, in the test extras)

One small gRPC message (7 bytes + 5-byte prefix) per DATA frame, 100 frames per batch, like one
engine step for 100 streams on one stream id. h2: `send_data` per frame + one `data_to_send`;
`receive_data` of the batch + `acknowledge_received_data`. Hand-written: what `conn.py` does -
one struct pack per frame joined into one bytes; one `unpack_from` per frame plus
`split_messages`. The decision is in the package docstring (lab.wire.h2grpc), the figures in
docs/measurements.md "HTTP/2 framing: h2 against hand-written"."""

from __future__ import annotations

import timeit

from lab.wire.h2grpc.frames import DATA_AND_PREFIX, FRAME_HEADER
from lab.wire.h2grpc.messages import split_messages

MSG = b"\x0a\x05\x08\xe8\x07\x10\x01"
BATCH = 100


def _h2_pair() -> tuple[object, object]:
    import h2.config
    import h2.connection

    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    s = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    c.initiate_connection()
    s.initiate_connection()
    s.receive_data(c.data_to_send())
    c.receive_data(s.data_to_send())
    s.receive_data(c.data_to_send())
    c.send_headers(
        1,
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/a/b"),
            (":authority", "x"),
            ("content-type", "application/grpc"),
        ],
        end_stream=True,
    )
    s.receive_data(c.data_to_send())
    s.send_headers(1, [(":status", "200"), ("content-type", "application/grpc")])
    c.increment_flow_control_window(2**31 - 1 - 65535)
    c.increment_flow_control_window(2**31 - 1 - 65535, stream_id=1)
    s.receive_data(c.data_to_send())
    c.receive_data(s.data_to_send())
    return c, s


def measure(number: int = 50) -> dict[str, float]:
    """Microseconds per frame for each of the four paths."""
    c, s = _h2_pair()
    payload = b"\x00\x00\x00\x00\x07" + MSG

    def h2_send() -> bytes:
        for _ in range(BATCH):
            s.send_data(1, payload)  # type: ignore[attr-defined]
        return s.data_to_send()  # type: ignore[attr-defined]

    blob = h2_send()

    def h2_recv() -> None:
        c.receive_data(blob)  # type: ignore[attr-defined]
        c.acknowledge_received_data(len(blob), 1)  # type: ignore[attr-defined]

    n = len(MSG) + 5

    def hand_send() -> bytes:
        out = []
        for _ in range(BATCH):
            out.append(DATA_AND_PREFIX.pack(n >> 8, n & 0xFF, 0, 0, 1, 0, n - 5))
            out.append(MSG)
        return b"".join(out)

    hblob = hand_send()

    def hand_recv() -> None:
        msgs: list[bytes] = []
        unpack = FRAME_HEADER.unpack_from
        pos, end_all = 0, len(hblob)
        while pos < end_all:
            hi, lo, _ftype, _flags, _sid = unpack(hblob, pos)
            end = pos + 9 + ((hi << 8) | lo)
            split_messages(None, hblob[pos + 9 : end], msgs.append, -1)
            pos = end

    out = {}
    for name, fn in (
        ("h2 send", h2_send),
        ("h2 receive", h2_recv),
        ("hand send", hand_send),
        ("hand receive", hand_recv),
    ):
        best = min(timeit.repeat(fn, number=number, repeat=5))
        out[name] = best / (number * BATCH) * 1e6
    return out


def main() -> None:
    for name, us in measure().items():
        print(f"{name:13} {us:6.2f} us/frame")


if __name__ == "__main__":
    main()
