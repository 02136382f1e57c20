"""The request recorder: the last 256 ACCEPTED Generate requests, off by default.

Tests use it to assert what a sidecar put on the wire. It is served on the engine's port as
`/loadlab.mocker.v1.Recorder/List` (a hand-registered server-streaming method: request
`openengine.v1.GetServerInfoRequest` (empty), responses `openengine.v1.GenerateRequest`, oldest
first); with recording off it answers FAILED_PRECONDITION. See `list_recorded()` for a client.
"""

from __future__ import annotations

from collections import deque

import grpc

from .pb import generation_pb2, server_pb2

RECORDER_SERVICE = "loadlab.mocker.v1.Recorder"
RECORDER_LIST_METHOD = f"/{RECORDER_SERVICE}/List"


class RequestRecorder:
    def __init__(self, enabled: bool, capacity: int) -> None:
        self.enabled = enabled
        self._ring: deque[bytes] = deque(maxlen=capacity)

    def record(self, request: generation_pb2.GenerateRequest) -> None:
        if self.enabled:
            self._ring.append(request.SerializeToString())

    def snapshot(self) -> list[bytes]:
        return list(self._ring)

    def handler(self) -> grpc.GenericRpcHandler:
        async def list_recorded(_request, context):
            if not self.enabled:
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "request recording is disabled (start the mocker with --record-requests)",
                )
            for raw in self.snapshot():
                yield raw

        return grpc.method_handlers_generic_handler(
            RECORDER_SERVICE,
            {
                "List": grpc.unary_stream_rpc_method_handler(
                    list_recorded,
                    request_deserializer=server_pb2.GetServerInfoRequest.FromString,
                    response_serializer=None,  # already bytes
                )
            },
        )


def list_recorded(
    channel: grpc.Channel, timeout: float = 10.0
) -> list[generation_pb2.GenerateRequest]:
    """Client helper (sync channel): the recorded requests, oldest first."""
    call = channel.unary_stream(
        RECORDER_LIST_METHOD,
        request_serializer=server_pb2.GetServerInfoRequest.SerializeToString,
        response_deserializer=generation_pb2.GenerateRequest.FromString,
    )
    return list(call(server_pb2.GetServerInfoRequest(), timeout=timeout))
