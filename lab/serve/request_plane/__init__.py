"""The request plane between frontend and sidecar: length-prefixed frames over TCP, many streams
multiplexed on a small pool of persistent connections per worker. See frames.py for the layout."""

from __future__ import annotations

from lab.serve.request_plane.client import RequestPlaneClient, ResponseStream, WorkerUnavailable
from lab.serve.request_plane.frames import MAX_PAYLOAD, FrameType, error_end
from lab.serve.request_plane.server import RequestPlaneServer, StreamSink

__all__ = [
    "MAX_PAYLOAD",
    "FrameType",
    "RequestPlaneClient",
    "RequestPlaneServer",
    "ResponseStream",
    "StreamSink",
    "WorkerUnavailable",
    "error_end",
]
