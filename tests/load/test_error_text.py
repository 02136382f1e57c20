"""Error text of a non-OpenAI-shaped error body (Dynamo answers {"message", "type", "code"})."""

from __future__ import annotations

from lab.load.sse import error_message_from_body


def test_error_text_of_openai_and_dynamo_bodies() -> None:
    openai = b'{"error": {"message": "no worker", "type": "service_unavailable"}}'
    assert error_message_from_body(openai) == "service_unavailable: no worker"
    dynamo = b'{"message":"Invalid request","type":"Bad Request","code":400}'
    assert error_message_from_body(dynamo) == "Invalid request"
    assert error_message_from_body(b"plain text") == "plain text"
