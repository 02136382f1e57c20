"""Helpers for the mocker server tests (no tests here): start a `mocker serve` process, talk to
it with a sync gRPC client, build requests, collect streams."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format, struct_pb2

from lab.wire import constants as wc
from lab.wire.gen.loadlab.mocker.v1 import admin_pb2, admin_pb2_grpc
from lab.wire.gen.openengine.v1 import (
    generation_pb2 as g,
)
from lab.wire.gen.openengine.v1 import (
    kv_pb2,
    lifecycle_pb2,
    openengine_pb2_grpc,
)
from tests import procs
from tests.procs import Proc, start

MODEL = "mocker-model"
SEED = 42


@dataclass
class Engine:
    proc: Proc
    channel: grpc.Channel
    admin_channel: grpc.Channel

    def __post_init__(self) -> None:
        self.inference = openengine_pb2_grpc.InferenceStub(self.channel)
        self.control = openengine_pb2_grpc.ControlStub(self.channel)
        self.admin = admin_pb2_grpc.AdminStub(self.admin_channel)

    @property
    def address(self) -> str:
        return self.proc.address

    def generate(self, request: g.GenerateRequest, timeout: float = 30) -> list[g.GenerateResponse]:
        return list(self.inference.Generate(request, timeout=timeout))

    def refusal(self, request: g.GenerateRequest) -> grpc.RpcError:
        """The gRPC error a refused request gets (fails the test if it is accepted)."""
        with pytest.raises(grpc.RpcError) as info:
            self.generate(request)
        return info.value

    def abort(self, request_id: str) -> lifecycle_pb2.AbortResponse:
        return self.control.Abort(lifecycle_pb2.AbortRequest(request_id=request_id), timeout=10)

    def load(self):
        from lab.wire.gen.openengine.v1 import server_pb2

        return self.control.GetLoad(server_pb2.GetLoadRequest(), timeout=10)


def mocker_argv(*extra: str) -> list[str]:
    """`mocker serve` with its admin service on a port of its own (the tests inject faults)."""
    return procs.mocker_argv(*extra, admin=True)


@contextlib.contextmanager
def engine_process(log_dir: Path, name: str, *extra: str) -> Iterator[Engine]:
    """A `mocker serve` process for a whole test module (module-scoped fixtures)."""
    proc = start(name, mocker_argv(*extra), log_dir)
    channels: list[grpc.Channel] = []
    try:
        proc.wait_ready(60)
        channels = [grpc.insecure_channel(proc.address), grpc.insecure_channel(proc.ready["admin"])]
        yield Engine(proc, *channels)
    finally:
        for channel in channels:
            channel.close()
        proc.stop()


def request(
    request_id: str,
    prompt: list[int] | None = None,
    *,
    max_tokens: int | None = 4,
    min_tokens: int | None = None,
    model: str = MODEL,
    stop_ids: tuple[int, ...] = (),
    output_logprobs: bool = False,
    output_top_n: int | None = None,
    prompt_logprobs: bool = False,
    prompt_top_n: int | None = None,
    context_only: bool = False,
    session: kv_pb2.KvSessionRef | None = None,
) -> g.GenerateRequest:
    stopping = g.StoppingOptions(
        conditions=[g.StopCondition(stop_token_id=t) for t in stop_ids]
    )
    if max_tokens is not None:
        stopping.max_tokens = max_tokens
    if min_tokens is not None:
        stopping.min_tokens = min_tokens
    resp = g.ResponseOptions()
    if output_logprobs:
        resp.return_output_logprobs = True
    if output_top_n is not None:
        resp.output_candidates.top_n = output_top_n
    if prompt_logprobs:
        resp.return_prompt_logprobs = True
    if prompt_top_n is not None:
        resp.prompt_candidates.top_n = prompt_top_n
    req = g.GenerateRequest(
        request_id=request_id,
        model=model,
        token_ids=g.TokenIds(ids=prompt if prompt is not None else list(range(1000, 1016))),
        stopping=stopping,
        response=resp,
    )
    if context_only:
        req.extra.update({wc.REQUEST_TYPE_KEY: wc.CONTEXT_ONLY, wc.DETOKENIZE_KEY: False})
    if session is not None:
        req.kv.session.CopyFrom(session)
    return req


def events(responses: list[g.GenerateResponse]) -> list[str]:
    return [r.WhichOneof("event") for r in responses]


def tokens_of(responses: list[g.GenerateResponse]) -> list[int]:
    return [t.token_id for r in responses if r.HasField("token") for t in r.token.tokens]


def token_infos(responses: list[g.GenerateResponse]) -> list[g.TokenInfo]:
    return [t for r in responses if r.HasField("token") for t in r.token.tokens]


def assert_one_terminal(responses: list[g.GenerateResponse]) -> g.GenerateResponse:
    """Exactly one terminal, last; usage only there; no empty event; output_index always 0."""
    kinds = events(responses)
    assert None not in kinds, kinds
    terminals = [k for k in kinds if k in ("finished", "prefill_ready", "error")]
    assert len(terminals) == 1 and kinds[-1] == terminals[0], kinds
    assert all(not r.HasField("usage") for r in responses[:-1])
    for r in responses:
        if r.HasField("token"):
            assert r.token.HasField("output_index") and r.token.output_index == 0
            assert len(r.token.tokens) >= 1
    return responses[-1]


def handoff_json(session: kv_pb2.KvSessionRef) -> dict:
    """KvSessionRef -> the sidecar's JSON handoff {session_id, transfer_backend, endpoints,
    dp_rank, attributes}, through a real JSON text codec."""
    import json

    d = json_format.MessageToDict(
        session, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    d[wc.HANDOFF_ATTRIBUTES] = d.pop("attributes_struct", {})
    return json.loads(json.dumps(d))


def session_from_json(obj: dict) -> kv_pb2.KvSessionRef:
    """The decode sidecar's rebuild: the JSON handoff -> KvSessionRef."""
    d = dict(obj)
    if wc.HANDOFF_ATTRIBUTES in d:
        d["attributes_struct"] = d.pop(wc.HANDOFF_ATTRIBUTES)
    return json_format.ParseDict(d, kv_pb2.KvSessionRef())


def attrs(session: kv_pb2.KvSessionRef) -> dict:
    return json_format.MessageToDict(session.attributes_struct)


def struct(d: dict) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(d)
    return s


def admin_set_health(engine: Engine, service: str, status: int) -> None:
    engine.admin.SetHealth(admin_pb2.SetHealthRequest(service=service, status=status), timeout=10)
