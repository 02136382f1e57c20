"""h2grpc: a batched HTTP/2 gRPC transport for the load lab's per-token streams.

Why: grpc.aio spends ~30-50 us of CPU per streamed message on each side (Python/Cython
per-message machinery plus a poller thread), which caps the lab. One engine step produces the
next message of every stream in the same event-loop turn, so a transport that writes all of
them in ONE socket write, and parses a whole recv() of frames in one pass on the client, is an
order of magnitude cheaper. Imports nothing from the rest of the project.

Public API (drop-ins for the subsets the mocker and the sidecar use):

* `H2GrpcServer(options=None)` - `add_insecure_port(addr) -> int` (binds now),
  `add_generic_rpc_handlers(handlers)`, `add_registered_method_handlers(service, handlers)`,
  `await start()`, `await stop(grace)`, `await wait_for_termination(timeout=None)`.
  Unary-unary and unary-stream; async functions / async generators (plain ones run inline).
* `H2GrpcChannel(target, options=None)` - `unary_stream(method, request_serializer=None,
  response_deserializer=None)`, `unary_unary(...)`, `await close()`; calls iterate/await like
  grpc.aio, fail with `grpc.aio.AioRpcError`, `cancel()` then reading raises CancelledError.
  Options: `grpc.max_receive_message_length`, and grpcio's keepalive args
  (`grpc.keepalive_time_ms`, `grpc.keepalive_timeout_ms`, `grpc.keepalive_permit_without_calls`):
  PINGs on a quiet connection, which is declared dead when one goes unanswered (`keepalive`).

Modules: `frames` (HTTP/2 + gRPC wire encodings), `messages` (length-prefixed message
reassembly), `metadata`, `conn` (the shared connection: batched writes, one-pass reads, flow
control), `server`, `client`, `keepalive` (the client's PINGs), `bench`
(`python -m lab.wire.h2grpc.bench`), `framecost`.

Framing: hand-written, not `h2`. `python -m lab.wire.h2grpc.framecost` (h2 4.4.1, Python 3.11,
Intel Xeon @ 2.60GHz shared 2-core VM, best of 5, one 12-byte DATA frame per message):

    h2 send_data + data_to_send       7-13 us/frame
    h2 receive_data + ack             10-22 us/frame
    hand-written send (struct pack)   0.3-0.5 us/frame
    hand-written receive + split      0.7-1.0 us/frame

h2 alone would cost more per message than the whole budget we aim for (h2 server + h2 client
measure ~1.5-6 us/msg on the server and ~2-5 us/msg on the client vs grpc.aio's ~30-55 on each,
see `bench`), so the frame layer is
hand-written (DATA, HEADERS, CONTINUATION, SETTINGS, WINDOW_UPDATE, PING, RST_STREAM, GOAWAY,
padding, max frame size) and only HPACK *decoding* uses the `hpack` library. Outbound header
blocks are literals without indexing (stateless, pre-built per method), so our encoder never
touches a dynamic table.
"""

from .client import H2GrpcChannel
from .keepalive import KEEPALIVE_LOST
from .server import H2GrpcServer

__all__ = ["KEEPALIVE_LOST", "H2GrpcChannel", "H2GrpcServer"]
