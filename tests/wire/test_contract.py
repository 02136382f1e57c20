"""The compiled protos match openengine-v1-fields.md (the authoritative v0.1.0 listing) exactly.

Parses the document (every file, import, enum value, message field, oneof and service RPC) and
compares it with the descriptors of the generated modules, so a typo in a .proto fails here.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

FIELDS_DOC = Path(__file__).resolve().parents[2].parent / "shared/docs/openengine-v1-fields.md"
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

# (name, label, type, oneof) by field number
Fields = dict[int, tuple[str, str, str, str]]


@dataclass
class ProtoFile:
    imports: set[str] = field(default_factory=set)
    enums: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    messages: dict[str, Fields] = field(default_factory=dict)
    services: dict[str, dict[str, tuple[str, str, str]]] = field(default_factory=dict)


@dataclass
class Doc:
    summary: str
    files: dict[str, ProtoFile]


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def parse_fields_doc(text: str) -> Doc:
    summary = ""
    files: dict[str, ProtoFile] = {}
    current: ProtoFile | None = None
    kind = name = ""
    for line in text.splitlines():
        if m := re.match(r"^\d+ files, \d+ services, \d+ messages, \d+ enums\.$", line):
            summary = m.group(0)
        elif m := re.match(r"^## (\S+\.proto) \(proto3\)$", line):
            current = files.setdefault(m.group(1), ProtoFile())
            kind = name = ""
        elif current is None:
            continue
        elif line.startswith("imports:"):
            current.imports = set(re.findall(r"`([^`]+)`", line))
        elif m := re.match(r"^### (enum|message|service) (\w+)$", line):
            kind, name = m.groups()
            if kind == "message":
                current.messages[name] = {}
            elif kind == "service":
                current.services[name] = {}
        elif kind == "enum" and "=" in line:
            values = [v.split("=") for v in line.split(",")]
            current.enums[name] = [(k.strip(), int(v)) for k, v in values]
        elif kind == "message" and re.match(r"^\| \d+ \|", line):
            num, fname, label, ftype, oneof = _cells(line)
            oneof_name = re.fullmatch(r"(?:oneof `(\w+)`)?", oneof)
            assert oneof_name is not None, line
            current.messages[name][int(num)] = (fname, label, ftype, oneof_name.group(1) or "")
        elif kind == "service" and line.startswith("| ") and not line.startswith("| RPC"):
            cells = _cells(line)
            if not set(cells[0]) <= {"-"}:
                current.services[name][cells[0]] = (cells[1], cells[2], cells[3])
    return Doc(summary, files)


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
def doc() -> Doc:
    if not FIELDS_DOC.is_file():
        pytest.skip(f"{FIELDS_DOC} not found (the shared specs sit beside the repository in CI)")
    return parse_fields_doc(FIELDS_DOC.read_text(encoding="utf-8"))


def test_parser_saw_the_whole_document(doc: Doc) -> None:
    """Guard against a parser that silently skips part of the listing."""
    text = FIELDS_DOC.read_text(encoding="utf-8")
    files = doc.files.values()
    counted = (
        f"{len(doc.files)} files, {sum(len(f.services) for f in files)} services, "
        f"{sum(len(f.messages) for f in files)} messages, {sum(len(f.enums) for f in files)} enums."
    )
    assert counted == doc.summary == "8 files, 2 services, 63 messages, 9 enums."
    field_rows = len(re.findall(r"^\| \d+ \|", text, re.MULTILINE))
    assert sum(len(m) for f in files for m in f.messages.values()) == field_rows == 243
    assert sum(len(rpcs) for f in files for rpcs in f.services.values()) == 11


def test_the_same_eight_files(doc: Doc) -> None:
    proto_root = Path(__file__).resolve().parents[2] / "proto"
    ours = {str(p.relative_to(proto_root)) for p in (proto_root / "openengine").rglob("*.proto")}
    assert ours == set(doc.files)


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
def test_file_matches_the_listing(doc: Doc, proto_path: str) -> None:
    expected = doc.files[proto_path]
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
