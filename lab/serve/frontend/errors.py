"""Errors in the OpenAI JSON shape: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

from typing import Any

import orjson

_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    413: "invalid_request_error",
    499: "cancelled",
    500: "internal_error",
    502: "internal_error",
    503: "service_unavailable",
}


class ApiError(Exception):
    """An error the client sees: HTTP status + OpenAI error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type_: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type_ or _TYPES.get(
            status, "internal_error" if status >= 500 else "invalid_request_error"
        )

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code if self.code is not None else self.status,
            }
        }

    def json_bytes(self) -> bytes:
        return orjson.dumps(self.body())

    def sse_bytes(self) -> bytes:
        """The error event of a stream whose headers were already sent."""
        return b"data: " + self.json_bytes() + b"\n\n"


def bad_field(param: str, message: str) -> ApiError:
    """400 naming the offending field."""
    return ApiError(400, f"{param}: {message}", param=param, code="invalid_value")


# END.error.kind (request plane) -> HTTP status, when the sidecar suggested none.
KIND_STATUS = {
    "invalid_request": 400,
    "engine_error": 500,
    "retryable": 503,
    "cancelled": 499,
    "protocol": 502,
    "unavailable": 503,
}


def from_end_error(error: dict[str, Any], worker_id: str | None) -> ApiError:
    kind = str(error.get("kind") or "engine_error")
    status = error.get("status")
    if not isinstance(status, int) or not 400 <= status <= 599:
        status = KIND_STATUS.get(kind, 500)
    where = f" (worker {worker_id})" if worker_id else ""
    return ApiError(status, f"{error.get('message') or kind}{where}", code=kind)
