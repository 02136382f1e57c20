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
control), `server`, `client`, `keepalive` (the client's PINGs). The benchmarks that measure
them are not shipped: `python -m tests.bench.h2grpc_bench` (the hop, against grpc.aio) and
`python -m tests.bench.framecost` (one frame, against `h2`).

Framing: hand-written, not `h2`: `h2` costs an order of magnitude more per frame than packing
and splitting frames by hand, more per message than the whole hop's budget (docs/measurements.md
"HTTP/2 framing: h2 against hand-written"), so the frame layer is
hand-written (DATA, HEADERS, CONTINUATION, SETTINGS, WINDOW_UPDATE, PING, RST_STREAM, GOAWAY,
padding, max frame size) and only HPACK *decoding* uses the `hpack` library. Outbound header
blocks are literals without indexing (stateless, pre-built per method), so our encoder never
touches a dynamic table.
"""

from .client import H2GrpcChannel
from .keepalive import KEEPALIVE_LOST
from .server import H2GrpcServer

__all__ = ["KEEPALIVE_LOST", "H2GrpcChannel", "H2GrpcServer"]
