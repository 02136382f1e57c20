"""The generated protobuf modules the server uses, under short names."""

from __future__ import annotations

from grpc_health.v1 import health_pb2, health_pb2_grpc

from lab.wire.gen.loadlab.mocker.v1 import admin_pb2, admin_pb2_grpc
from lab.wire.gen.openengine.v1 import (
    error_pb2,
    generation_pb2,
    kv_pb2,
    lifecycle_pb2,
    lora_pb2,
    model_pb2,
    openengine_pb2_grpc,
    server_pb2,
)

__all__ = [
    "admin_pb2",
    "admin_pb2_grpc",
    "error_pb2",
    "generation_pb2",
    "health_pb2",
    "health_pb2_grpc",
    "kv_pb2",
    "lifecycle_pb2",
    "lora_pb2",
    "model_pb2",
    "openengine_pb2_grpc",
    "server_pb2",
]
