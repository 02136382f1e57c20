"""The committed reference of openengine v0.1.0 that `test_contract.py` compares against.

`openengine_v0_1_0.json` (beside this file) holds, for each of the eight .proto files, its
imports, enums (value name, number), messages (per field number: name, label, type, oneof) and
services (per RPC: request, response, kind), plus the totals of the listing it came from. It
was built once from the published v0.1.0 field-by-field listing (a Markdown document: one
`## <file>.proto (proto3)` section per file, `### enum|message|service NAME` subsections, one
table row per field or RPC) with

    python -m tests.wire.reference LISTING.md          # writes tests/wire/openengine_v0_1_0.json

To move to another contract version, run it on that version's listing and review the diff.
The test itself never needs the listing: the reference is in the repository.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

REFERENCE = Path(__file__).with_name("openengine_v0_1_0.json")

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



def totals(doc: Doc) -> dict[str, int]:
    """What the listing holds, counted: the reference stores it so a truncated table is caught."""
    files = doc.files.values()
    return {
        "files": len(doc.files),
        "services": sum(len(f.services) for f in files),
        "messages": sum(len(f.messages) for f in files),
        "enums": sum(len(f.enums) for f in files),
        "fields": sum(len(m) for f in files for m in f.messages.values()),
        "rpcs": sum(len(rpcs) for f in files for rpcs in f.services.values()),
    }


def to_json(doc: Doc, text: str) -> dict:
    """The reference document; refuses a listing whose own summary or row count disagrees."""
    counted = totals(doc)
    summary = (
        f"{counted['files']} files, {counted['services']} services, "
        f"{counted['messages']} messages, {counted['enums']} enums."
    )
    if summary != doc.summary:
        raise SystemExit(f"parsed {summary!r} but the listing says {doc.summary!r}")
    rows = len(re.findall(r"^\| \d+ \|", text, re.MULTILINE))
    if rows != counted["fields"]:
        raise SystemExit(f"parsed {counted['fields']} fields but the listing has {rows} rows")
    files = {
        name: {
            "imports": sorted(f.imports),
            "enums": f.enums,
            "messages": {
                m: {str(n): list(v) for n, v in fs.items()} for m, fs in f.messages.items()
            },
            "services": {
                s: {r: list(v) for r, v in rpcs.items()} for s, rpcs in f.services.items()
            },
        }
        for name, f in sorted(doc.files.items())
    }
    return {"contract": "openengine.v1 v0.1.0", "totals": counted, "files": files}


def dump(data: dict) -> str:
    """JSON with one line per field, enum value or RPC, so a contract change reads as a diff."""
    text = json.dumps(data, indent=1)
    # Collapse every innermost list (no nested brackets or braces) onto one line.
    return re.sub(
        r"\[\s*([^\[\]{}]*?)\s*\]",
        lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",\n")) + "]",
        text,
    ) + "\n"


def load_reference(path: Path = REFERENCE) -> tuple[dict[str, int], dict[str, ProtoFile]]:
    """The committed reference as (totals, ProtoFile per .proto path)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    files: dict[str, ProtoFile] = {}
    for name, f in data["files"].items():
        files[name] = ProtoFile(
            imports=set(f["imports"]),
            enums={e: [(k, int(v)) for k, v in values] for e, values in f["enums"].items()},
            messages={
                m: {int(n): tuple(v) for n, v in fs.items()}  # type: ignore[misc]
                for m, fs in f["messages"].items()
            },
            services={
                s: {r: tuple(v) for r, v in rpcs.items()}  # type: ignore[misc]
                for s, rpcs in f["services"].items()
            },
        )
    return data["totals"], files


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    text = Path(argv[0]).read_text(encoding="utf-8")
    out = to_json(parse_fields_doc(text), text)
    REFERENCE.write_text(dump(out), encoding="utf-8")
    print(f"wrote {REFERENCE} ({out['totals']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
