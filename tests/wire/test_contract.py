"""The compiled protos match the committed reference of openengine v0.1.0 exactly.

The reference (`openengine_v0_1_0.json`, built as `reference.py` documents) lists every file,
import, enum value, message field, oneof and service RPC; this compares it with the descriptors
of the generated modules, so a typo in a .proto fails here. It is in the repository, so the test
never depends on a file outside it.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from tests.wire.reference import REFERENCE, Fields, ProtoFile, load_reference

PACKAGE = "openengine.v1"
GEN = "lab.wire.gen"

_T = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    _T.TYPE_DOUBLE: "double",
    _T.TYPE_FLOAT: "float",
    _T.TYPE_INT64: "int64",
    _T.TYPE_UINT64: "uint64",
    _T.TYPE_INT32: "int32",
    _T.TYPE_FIXED64: "fixed64",
    _T.TYPE_FIXED32: "fixed32",
    _T.TYPE_BOOL: "bool",
    _T.TYPE_STRING: "string",
    _T.TYPE_BYTES: "bytes",
    _T.TYPE_UINT32: "uint32",
    _T.TYPE_SFIXED32: "sfixed32",
    _T.TYPE_SFIXED64: "sfixed64",
    _T.TYPE_SINT32: "sint32",
    _T.TYPE_SINT64: "sint64",
}

def _short(type_name: str, package: str) -> str:
    """`.openengine.v1.TokenIds` -> `TokenIds` (same package); `.google.protobuf.Struct` stays."""
    return type_name.removeprefix(f".{package}.").removeprefix(".")


def describe_file(proto_path: str) -> tuple[descriptor_pb2.FileDescriptorProto, ProtoFile]:
    dotted = proto_path.removesuffix(".proto").replace("/", ".")
    module = importlib.import_module(f"{GEN}.{dotted}_pb2")
    fdp = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(fdp)
    out = ProtoFile(imports=set(fdp.dependency))
    for enum in fdp.enum_type:
        out.enums[enum.name] = [(v.name, v.number) for v in enum.value]
    for msg in fdp.message_type:
        assert not msg.nested_type and not msg.enum_type, f"{msg.name} has nested types"
        fields: Fields = {}
        for f in msg.field:
            if f.label == _T.LABEL_REPEATED:
                label = "repeated"
            elif f.proto3_optional:
                label = "optional"
            else:
                label = ""
            if f.type == _T.TYPE_ENUM:
                ftype = "enum " + _short(f.type_name, fdp.package)
            elif f.type == _T.TYPE_MESSAGE:
                ftype = _short(f.type_name, fdp.package)
            else:
                ftype = _SCALARS[f.type]
            oneof = ""
            if f.HasField("oneof_index") and not f.proto3_optional:
                oneof = msg.oneof_decl[f.oneof_index].name
            assert f.number not in fields, f"{msg.name}: duplicate number {f.number}"
            fields[f.number] = (f.name, label, ftype, oneof)
        out.messages[msg.name] = fields
    for svc in fdp.service:
        rpcs = {}
        for m in svc.method:
            kind = {
                (False, False): "unary",
                (False, True): "server-streaming",
                (True, False): "client-streaming",
                (True, True): "bidi-streaming",
            }[(m.client_streaming, m.server_streaming)]
            req = ("stream " if m.client_streaming else "") + _short(m.input_type, fdp.package)
            resp = ("stream " if m.server_streaming else "") + _short(m.output_type, fdp.package)
            rpcs[m.name] = (req, resp, kind)
        out.services[svc.name] = rpcs
    return fdp, out


@pytest.fixture(scope="module")
def reference() -> dict[str, ProtoFile]:
    return load_reference()[1]


def test_reference_is_whole() -> None:
    """Guard against a reference that lost part of the listing: its totals are recounted."""
    totals, files = load_reference()
    values = files.values()
    counted = {
        "files": len(files),
        "services": sum(len(f.services) for f in values),
        "messages": sum(len(f.messages) for f in values),
        "enums": sum(len(f.enums) for f in values),
        "fields": sum(len(m) for f in values for m in f.messages.values()),
        "rpcs": sum(len(rpcs) for f in values for rpcs in f.services.values()),
    }
    expected = {"files": 8, "services": 2, "messages": 63, "enums": 9, "fields": 243, "rpcs": 11}
    assert counted == totals == expected, REFERENCE


def test_the_same_eight_files(reference: dict[str, ProtoFile]) -> None:
    proto_root = Path(__file__).resolve().parents[2] / "proto"
    ours = {str(p.relative_to(proto_root)) for p in (proto_root / "openengine").rglob("*.proto")}
    assert ours == set(reference)


@pytest.mark.parametrize(
    "proto_path",
    [
        "openengine/v1/error.proto",
        "openengine/v1/generation.proto",
        "openengine/v1/kv.proto",
        "openengine/v1/lifecycle.proto",
        "openengine/v1/lora.proto",
        "openengine/v1/model.proto",
        "openengine/v1/openengine.proto",
        "openengine/v1/server.proto",
    ],
)
def test_file_matches_the_reference(reference: dict[str, ProtoFile], proto_path: str) -> None:
    expected = reference[proto_path]
    fdp, actual = describe_file(proto_path)
    assert fdp.package == PACKAGE
    assert fdp.syntax == "proto3"
    assert actual.imports == expected.imports
    assert actual.enums == expected.enums
    assert set(actual.messages) == set(expected.messages)
    for name, fields in expected.messages.items():
        assert actual.messages[name] == fields, f"message {name}"
    assert actual.services == expected.services


def test_admin_contract() -> None:
    fdp, actual = describe_file("loadlab/mocker/v1/admin.proto")
    assert fdp.package == "loadlab.mocker.v1" and fdp.syntax == "proto3"
    assert actual.services == {
        "Admin": {
            "SetHealth": ("SetHealthRequest", "AdminReply", "unary"),
            "StallTokens": ("StallTokensRequest", "AdminReply", "unary"),
            "Freeze": ("FreezeRequest", "AdminReply", "unary"),
            "Exit": ("ExitRequest", "AdminReply", "unary"),
            "ExecutorFailure": ("ExecutorFailureRequest", "AdminReply", "unary"),
        }
    }
    assert actual.messages == {
        "SetHealthRequest": {1: ("service", "", "string", ""), 2: ("status", "", "int32", "")},
        "StallTokensRequest": {1: ("seconds", "", "double", "")},
        "FreezeRequest": {1: ("frozen", "", "bool", "")},
        "ExitRequest": {1: ("code", "", "int32", "")},
        "ExecutorFailureRequest": {1: ("message", "", "string", "")},
        "AdminReply": {1: ("message", "", "string", "")},
    }
