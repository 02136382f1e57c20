"""A request refused before acceptance: becomes a non-OK gRPC status (never an in-band event)."""

from __future__ import annotations

import grpc


class RequestRefused(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def invalid(message: str) -> RequestRefused:
    return RequestRefused(grpc.StatusCode.INVALID_ARGUMENT, message)


def unimplemented(message: str) -> RequestRefused:
    return RequestRefused(grpc.StatusCode.UNIMPLEMENTED, message)


def not_simulated(feature: str) -> RequestRefused:
    return unimplemented(f"{feature} is not simulated by the Mocker server")


def not_implemented(rpc: str) -> RequestRefused:
    return unimplemented(f"{rpc} is not implemented by the TensorRT-LLM OpenEngine server")
