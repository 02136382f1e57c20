"""h2grpc: a batched HTTP/2 gRPC transport for the load lab's per-token streams.

(Filled in with the measurements and the framing decision below.)
"""
