"""HTTP/2 framing and the gRPC wire conventions, hand-written (see the package docstring for why
not `h2`): frame headers, outbound header blocks, gRPC length-prefixed messages, status and
timeout encodings. Pure functions and constants; no I/O, no state beyond what a caller holds."""

from __future__ import annotations

import struct
import urllib.parse

import grpc

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types (RFC 9113 section 6).
DATA = 0x0
HEADERS = 0x1
PRIORITY = 0x2
RST_STREAM = 0x3
SETTINGS = 0x4
PUSH_PROMISE = 0x5
PING = 0x6
GOAWAY = 0x7
WINDOW_UPDATE = 0x8
CONTINUATION = 0x9

# Flags.
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# SETTINGS identifiers.
SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_ENABLE_PUSH = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE = 0x6

# Error codes (RFC 9113 section 7).
NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
FLOW_CONTROL_ERROR = 0x3
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
ENHANCE_YOUR_CALM = 0xB

DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
MAX_WINDOW = 2**31 - 1

#: length (hi 16 bits, lo 8 bits), type, flags, stream id: one unpack per frame.
FRAME_HEADER = struct.Struct(">HBBBL")
#: A DATA frame header followed by the gRPC message prefix (compressed flag, length): the
#: fast path of sending one whole message in one frame packs both with one call.
DATA_AND_PREFIX = struct.Struct(">HBBBLBL")
MESSAGE_PREFIX = struct.Struct(">BL")
_U32 = struct.Struct(">L")
_SETTING = struct.Struct(">HL")
_GOAWAY = struct.Struct(">LL")


def frame(ftype: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return FRAME_HEADER.pack(n >> 8, n & 0xFF, ftype, flags, stream_id) + payload


def settings_frame(settings: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(k, v) for k, v in settings.items()))


def parse_settings(payload: bytes) -> list[tuple[int, int]]:
    return [_SETTING.unpack_from(payload, i) for i in range(0, len(payload) - 5, 6)]


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, _U32.pack(increment))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, _U32.pack(code))


def goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, _GOAWAY.pack(last_stream_id, code) + debug)


def u32(payload: bytes, offset: int = 0) -> int:
    return _U32.unpack_from(payload, offset)[0]


def header_frames(stream_id: int, block: bytes, end_stream: bool, max_frame: int) -> list[bytes]:
    """HEADERS (+ CONTINUATION when the block exceeds the peer's max frame size)."""
    es = END_STREAM if end_stream else 0
    if len(block) <= max_frame:
        return [frame(HEADERS, es | END_HEADERS, stream_id, block)]
    chunks = [block[i : i + max_frame] for i in range(0, len(block), max_frame)]
    out = [frame(HEADERS, es, stream_id, chunks[0])]
    for i, chunk in enumerate(chunks[1:], 1):
        out.append(
            frame(CONTINUATION, END_HEADERS if i == len(chunks) - 1 else 0, stream_id, chunk)
        )
    return out


# -- outbound HPACK: literal header fields without indexing, never Huffman -----------------------
# Encoding every outbound field as a literal that is not added to the dynamic table keeps our
# encoder stateless: header blocks can be pre-built once and reused for every call, and the
# peer's SETTINGS_HEADER_TABLE_SIZE never matters. Inbound blocks use the `hpack` decoder.


def _hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _hpack_str(s: bytes) -> bytes:
    return _hpack_int(len(s), 7, 0) + s


#: HPACK static-table indexes of the names we send (RFC 7541 appendix A).
_STATIC_NAME = {
    b":authority": 1,
    b":method": 2,
    b":path": 4,
    b":scheme": 6,
    b":status": 8,
    b"content-type": 31,
    b"te": 0,
    b"user-agent": 58,
}


def encode_headers(headers: list[tuple[bytes, bytes]]) -> bytes:
    out = []
    for name, value in headers:
        idx = _STATIC_NAME.get(name, 0)
        if name == b":status" and value == b"200":
            out.append(b"\x88")  # fully indexed static entry 8
        elif name == b":method" and value == b"POST":
            out.append(b"\x83")
        elif name == b":scheme" and value == b"http":
            out.append(b"\x86")
        elif idx:
            out.append(_hpack_int(idx, 4, 0x00) + _hpack_str(value))
        else:
            out.append(b"\x00" + _hpack_str(name) + _hpack_str(value))
    return b"".join(out)


# -- gRPC conventions ----------------------------------------------------------------------------

CONTENT_TYPE = b"application/grpc"

#: Percent-encode everything outside printable ASCII and '%' itself (gRPC HTTP/2 spec).
_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if c != 0x25)


def encode_message(details: str) -> bytes:
    return urllib.parse.quote(details, safe=_SAFE).encode("ascii")


def decode_message(raw: bytes) -> str:
    return urllib.parse.unquote(raw.decode("ascii", "replace"), errors="replace")


_TIMEOUT_UNITS = {
    b"H": 3600.0,
    b"M": 60.0,
    b"S": 1.0,
    b"m": 1e-3,
    b"u": 1e-6,
    b"n": 1e-9,
}


def parse_timeout(raw: bytes) -> float | None:
    """`grpc-timeout` ("1000m") -> seconds, None when malformed."""
    unit = _TIMEOUT_UNITS.get(raw[-1:])
    if unit is None or not raw[:-1].isdigit():
        return None
    return int(raw[:-1]) * unit


def encode_timeout(seconds: float) -> bytes:
    """Seconds -> `grpc-timeout`, at most 8 digits, in the finest unit that fits."""
    seconds = max(seconds, 0.0)
    for unit, scale in ((b"u", 1e6), (b"m", 1e3), (b"S", 1.0), (b"M", 1 / 60), (b"H", 1 / 3600)):
        value = int(seconds * scale) + (1 if seconds * scale % 1 else 0)
        if value < 100_000_000:
            return str(value).encode() + unit
    return b"99999999H"


STATUS_BY_CODE: dict[int, grpc.StatusCode] = {s.value[0]: s for s in grpc.StatusCode}


def status_from_int(value: int) -> grpc.StatusCode:
    return STATUS_BY_CODE.get(value, grpc.StatusCode.UNKNOWN)


#: RST_STREAM error code -> status, as grpc-core maps it on the client side.
STATUS_BY_RST = {
    NO_ERROR: grpc.StatusCode.INTERNAL,
    PROTOCOL_ERROR: grpc.StatusCode.INTERNAL,
    INTERNAL_ERROR: grpc.StatusCode.INTERNAL,
    FLOW_CONTROL_ERROR: grpc.StatusCode.INTERNAL,
    REFUSED_STREAM: grpc.StatusCode.UNAVAILABLE,
    CANCEL: grpc.StatusCode.CANCELLED,
    ENHANCE_YOUR_CALM: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def split_target(target: str) -> tuple[str, int]:
    """ "host:port" / "[v6]:port" / "dns:///host:port" / "ipv4:host:port" -> (host, port)."""
    for scheme in ("dns:///", "ipv4:", "ipv6:"):
        if target.startswith(scheme):
            target = target[len(scheme) :]
    host, _, port = target.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)
