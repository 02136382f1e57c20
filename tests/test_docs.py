"""Every citation of the design documents resolves inside the repository.

Code, tests and the docs themselves cite pages as `docs/<page>.md` (in docs: `<page>.md`),
optionally followed by a quoted section heading. Each cited page must exist under `docs/`, and
each cited heading must be one of that page's headings, so a renamed section or page fails here
rather than leaving a dangling reference for the next reader.

The other way round, every path and code name that README.md and docs/*.md cite exists, so a
renamed function or file fails here naming the page, the line and the name. The rule (what
is checked, and what is deliberately not, to keep false positives out):

Only text in backticks is read, outside code blocks (fenced, or indented after a blank line).

A. Paths. A token that starts with one of the repository's top-level directories (`lab/`,
   `mocker/`, `launch/`, `tests/`, `proto/`, `docs/`, `.ci/`) names a file or directory that
   exists (a glob matches something). A bare `name.py` lies in the directory of a path cited on
   the same page (`lab/nagle/stats.py`, `verdict.py`).
B. Dotted module names. A token `lab.x.y[.Name[.member]]` (the first part one of our packages)
   resolves: the longest prefix that is a module, then a definition of that module, then a member
   of that class.
C. `module.name`: a dotted name whose first part is the stem of a Python file the page cites
   (`payloads.end_payload`, `sockets.FramedConnection.queue_frame`) is defined in that file.
D. A name next to a cited file. A span that is one Python name (`function_name`, `Class`,
   `Class.method`, `CONSTANT`, optionally with `()`) that follows a cited `.py` path with only
   spaces, `,`, `:`, `;` or `(` between them (directly, or through a list of such names:
   `launch/commands.py`: `engine_settings`, `sidecar_settings`), or that precedes one with " in "
   or " of " (`with_request_times` in `lab/analysis/request_times.py`), is defined in that file:
   at its top level, or as a member of one of its classes (or their bases).
E. Classes anywhere. `Class.member` (the first part capitalised) names a class of ours, or a
   message or service of proto/, that has that member; a bare CamelCase name of two or more humps
   (`StreamSink`, `GenRequest`) is a class, function or constant of ours or a proto message,
   service, enum or RPC.

Not checked: lower-case dotted names that are not ours (`stream_options.include_usage`,
`net.ipv4.tcp_pingpong_thresh`: API fields and sysctls), lower-case names that no cited file sits
next to (JSON keys, settings fields, proto fields in tables), file names of a run directory
(`config.json`, `levels.csv`), members beyond the first after a class (instance attributes of
unknown type), and whatever is in code blocks (commands, outputs).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: `docs/page.md` then, optionally, `, "Heading"` or ` "Heading"` (the heading may wrap lines).
CITATION = re.compile(r'docs/([\w-]+\.md)(?:,?\s+"([^"]+)")?')
#: Inside docs/: `page.md` links and `[page.md](page.md) "Heading"` references.
DOC_LINK = re.compile(r'\]\(([\w-]+\.md)\)(?:\s+"([^"]+)")?')


def _headings(page: Path) -> set[str]:
    return {
        line.lstrip("#").strip()
        for line in page.read_text(encoding="utf-8").splitlines()
        if line.startswith("#")
    }


def _sources() -> list[Path]:
    files = [ROOT / "README.md"]
    for top in ("lab", "mocker", "launch", "tests"):
        files += [p for p in (ROOT / top).rglob("*.py") if "gen" not in p.relative_to(ROOT).parts]
    return [p for p in files if p != Path(__file__)]


def _check(citations: list[tuple[str, str | None]], where: str) -> list[str]:
    problems = []
    for page, heading in citations:
        path = DOCS / page
        if not path.is_file():
            problems.append(f"{where}: docs/{page} does not exist")
        elif heading is not None and " ".join(heading.split()) not in _headings(path):
            problems.append(f'{where}: docs/{page} has no heading "{heading}"')
    return problems


def test_code_citations_resolve() -> None:
    problems: list[str] = []
    seen = 0
    for path in _sources():
        found = CITATION.findall(path.read_text(encoding="utf-8"))
        seen += len(found)
        problems += _check([(p, h or None) for p, h in found], str(path.relative_to(ROOT)))
    assert not problems, "\n".join(problems)
    assert seen >= 25  # the check would pass vacuously if the pattern stopped matching


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_doc_links_resolve(page: str) -> None:
    found = DOC_LINK.findall((DOCS / page).read_text(encoding="utf-8"))
    problems = _check([(p, h or None) for p, h in found], f"docs/{page}")
    assert not problems, "\n".join(problems)


def test_no_citation_points_outside_the_repository() -> None:
    """The specs the lab was built from are not part of it; nothing may cite them."""
    # (spelt in pieces, so that this file does not match the repository-wide grep itself)
    outside = re.compile("shared/" + r"docs|contracts\.md|\bissue \d")
    hits = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in _sources()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if outside.search(line)
    ]
    assert not hits, hits


PACKAGES = ("lab", "mocker", "launch", "tests")
TOP_DIRS = ("lab/", "mocker/", "launch/", "tests/", "proto/", "docs/", ".ci/")
NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*(?:\(\))?")
CAMEL = re.compile(r"[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+")
#: What may stand between a cited file and the names after it, or between names of a list (D).
JOINER = re.compile(r"[\s,:;(]*")
#: What may stand between a name and the cited file after it (D: `name` in `file.py`).
JOINER_IN = re.compile(r"\s+(?:in|of)\s+")
#: File names of a run directory and other data files: not Python names.
DATA_SUFFIXES = {"json", "jsonl", "csv", "parquet", "png", "md", "py", "toml", "log", "txt",
                 "proto", "yaml", "html"}


@dataclass
class _Span:
    text: str
    line: int
    start: int
    end: int


@dataclass
class _Module:
    """What one Python file (or one proto file) defines: top-level names and class members."""

    path: Path
    names: set[str] = field(default_factory=set)
    classes: dict[str, tuple[set[str], list[str]]] = field(default_factory=dict)  # members, bases

    def members(self, cls: str, index: _Index, depth: int = 0) -> set[str]:
        members, bases = self.classes[cls]
        found = set(members)
        if depth < 5:
            for base in bases:
                for mod in index.defining_class(base):
                    found |= mod.members(base, index, depth + 1)
        return found

    def defines(self, name: str, index: _Index) -> bool:
        return name in self.names or any(
            name in self.members(c, index) for c in self.classes
        )


def _class_members(node: ast.ClassDef) -> set[str]:
    members: set[str] = set()
    for item in node.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            members.add(item.name)
        elif isinstance(item, ast.Assign):
            for target in item.targets:
                if isinstance(target, ast.Name):
                    members.add(target.id)
                    if target.id == "__slots__" and isinstance(item.value, (ast.Tuple, ast.List)):
                        members |= {
                            e.value for e in item.value.elts
                            if isinstance(e, ast.Constant) and isinstance(e.value, str)
                        }
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            members.add(item.target.id)
    for sub in ast.walk(node):  # self.x = ... in any method
        if isinstance(sub, (ast.Assign, ast.AnnAssign)):
            targets = sub.targets if isinstance(sub, ast.Assign) else [sub.target]
            for target in targets:
                if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                        and target.value.id == "self"):
                    members.add(target.attr)
    return members


def _python_module(path: Path) -> _Module:
    mod = _Module(path)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            mod.names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            mod.names.add(node.name)
            bases = [b.id if isinstance(b, ast.Name) else b.attr
                     for b in node.bases if isinstance(b, (ast.Name, ast.Attribute))]
            mod.classes[node.name] = (_class_members(node), bases)
        elif isinstance(node, ast.Assign):
            mod.names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            mod.names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            mod.names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return mod


_PROTO_BLOCK = re.compile(r"\b(message|service|enum)\s+(\w+)\s*\{")
_PROTO_MEMBER = re.compile(
    r"^\s*(?:rpc\s+(\w+)\s*\(|(?:repeated\s+|optional\s+)?(?:map<[^>]+>|[\w.]+)\s+(\w+)\s*=\s*\d+"
    r"|(\w+)\s*=\s*-?\d+\s*;)",
    re.M,
)


def _proto_module(path: Path) -> _Module:
    """Messages, services and enums with their fields, RPCs and values (members of the innermost
    enclosing block: enough for `Message.field` and `Service.Rpc`)."""
    mod = _Module(path)
    stack: list[str | None] = []  # one entry per open brace: the block's name, None for oneof
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.split("//")[0]
        block = _PROTO_BLOCK.search(line)
        named = [n for n in stack if n]
        member = _PROTO_MEMBER.match(line)
        if block:
            name = block.group(2)
            mod.names.add(name)
            mod.classes.setdefault(name, (set(), []))
        elif member and named:
            name = next(g for g in member.groups() if g)
            mod.classes[named[-1]][0].add(name)
            if member.group(1):
                mod.names.add(name)  # an RPC name alone (`GetLoad`) is a proto name too
        for char in line:
            if char == "{":
                stack.append(block.group(2) if block else None)
                block = None
            elif char == "}" and stack:
                stack.pop()
    return mod


class _Index:
    def __init__(self) -> None:
        self.modules: dict[Path, _Module] = {}
        for top in PACKAGES:
            for path in (ROOT / top).rglob("*.py"):
                if "gen" not in path.relative_to(ROOT).parts:
                    self.modules[path] = _python_module(path)
        for path in (ROOT / "proto").rglob("*.proto"):
            self.modules[path] = _proto_module(path)

    def defining_class(self, cls: str) -> list[_Module]:
        return [m for m in self.modules.values() if cls in m.classes]

    def anywhere(self, name: str) -> bool:
        return any(name in m.names for m in self.modules.values())

    def module_file(self, dotted: list[str]) -> tuple[Path, list[str]] | None:
        """The longest prefix of `dotted` that is one of our modules, and the rest."""
        for cut in range(len(dotted), 0, -1):
            base = ROOT.joinpath(*dotted[:cut])
            for path in (base.with_suffix(".py"), base / "__init__.py"):
                if path in self.modules:
                    return path, dotted[cut:]
        return None

    def resolve(self, path: Path, rest: list[str]) -> str | None:
        """None when `rest` (a definition, then a member) is defined in `path`, else the reason."""
        if not rest:
            return None
        mod = self.modules[path]
        head, *tail = rest
        where = path.relative_to(ROOT)
        if head not in mod.names and not (tail == [] and mod.defines(head, self)):
            return f"{where} defines no {head}"
        if tail and head in mod.classes and tail[0] not in mod.members(head, self):
            return f"{where}: class {head} has no member {tail[0]}"
        return None


def _masked(text: str) -> str:
    """The page with its code blocks blanked (line numbers kept)."""
    out, fenced, code, previous_blank = [], False, False, True
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            out.append("")
            continue
        indented = line.startswith("    ") and line.strip() != ""
        code = indented and (previous_blank or code)
        out.append("" if fenced or code else line)
        previous_blank = line.strip() == ""
        if not indented and line.strip():
            code = False
    return "\n".join(out)


def _spans(masked: str) -> list[_Span]:
    spans = []
    for m in re.finditer(r"`([^`\n]+(?:\n[^`\n]+)?)`", masked):
        body = m.group(1)
        if "\n" in body:  # a span wrapped at the end of a line
            first, second = body.split("\n")
            body = first + ("" if first.endswith("/") else " ") + second.strip()
        spans.append(_Span(body, masked.count("\n", 0, m.start()) + 1, m.start(), m.end()))
    return spans


def _is_name(text: str) -> bool:
    return bool(NAME.fullmatch(text)) and text.rsplit(".", 1)[-1] not in DATA_SUFFIXES


def _check_page(page: str, where: str, index: _Index) -> tuple[list[str], int]:
    """The problems of one page's text (rules A-E of the module docstring) and how many spans
    were checked."""
    text = _masked(page)
    spans = _spans(text)
    problems: list[str] = []
    checked = 0
    cited: dict[int, Path] = {}  # span index -> the .py file it names
    dirs: list[Path] = []

    def problem(span: _Span, why: str) -> None:
        problems.append(f"{where}:{span.line}: `{span.text}`: {why}")

    # A: paths (first pass: they give the page's context).
    for i, span in enumerate(spans):
        for token in span.text.split():
            token = token.rstrip(".,;:)")
            if token.startswith(TOP_DIRS):
                checked += 1
                hits = list(ROOT.glob(token)) if "*" in token else [ROOT / token]
                if not hits or not all(h.exists() for h in hits):
                    problem(span, f"{token} does not exist")
                    continue
                hit = hits[0]
                dirs.append(hit if hit.is_dir() else hit.parent)
                if hit.suffix == ".py" and token == span.text:
                    cited[i] = hit
    for i, span in enumerate(spans):
        if re.fullmatch(r"\w+\.py", span.text):
            checked += 1
            files = [d / span.text for d in dirs if (d / span.text).is_file()]
            if files:
                cited[i] = files[0]
            else:
                problem(span, "no such file in a directory this page cites")
    stems: dict[str, list[Path]] = {}
    for path in cited.values():
        stems.setdefault(path.stem, []).append(path)

    def anchors(i: int) -> list[Path]:
        """The cited files joined to span i through punctuation and a list of names (D)."""
        found: list[Path] = []
        for step in (-1, 1):
            j = i
            while 0 <= j + step < len(spans):
                a, b = (spans[j + step], spans[j]) if step < 0 else (spans[j], spans[j + step])
                gap = text[a.end:b.start]
                if not (JOINER_IN if step > 0 and j == i else JOINER).fullmatch(gap):
                    break
                j += step
                if j in cited:
                    found.append(cited[j])
                    break
                if not _is_name(spans[j].text):
                    break
        return found

    for i, span in enumerate(spans):
        for token in span.text.split():
            token = token.rstrip(".,;:)").removesuffix("()")
            parts = token.split(".")
            if parts[0] in PACKAGES and len(parts) > 1 and NAME.fullmatch(token):  # B
                checked += 1
                module = index.module_file(parts)
                if module is None:
                    problem(span, f"no module {token}")
                elif reason := index.resolve(*module):
                    problem(span, reason)
        if i in cited or not _is_name(span.text) or span.text.split(".")[0] in PACKAGES:
            continue
        parts = span.text.removesuffix("()").split(".")
        if len(parts) > 1 and parts[0] in stems:  # C
            checked += 1
            reasons = [index.resolve(p, parts[1:]) for p in stems[parts[0]]]
            if all(reasons):
                problem(span, reasons[0] or "")
            continue
        near = anchors(i) if len(parts) == 1 or parts[0][:1].isupper() else []
        if near:  # D
            checked += 1
            reasons = [index.resolve(p, parts) for p in near]
            if all(reasons):
                problem(span, f"{reasons[0]} (cited next to it)")
            continue
        if len(parts) > 1 and parts[0][:1].isupper():  # E: Class.member
            checked += 1
            classes = index.defining_class(parts[0])
            if not classes:
                problem(span, f"no class {parts[0]} in the code or proto/")
            elif not any(parts[1] in m.members(parts[0], index) for m in classes):
                owners = ", ".join(str(m.path.relative_to(ROOT)) for m in classes)
                problem(span, f"class {parts[0]} ({owners}) has no member {parts[1]}")
        elif len(parts) == 1 and CAMEL.fullmatch(parts[0]):  # E: a CamelCase name
            checked += 1
            if not index.anywhere(parts[0]):
                problem(span, "defined nowhere in the code or proto/")
    return problems, checked


def _doc_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


@pytest.fixture(scope="module")
def index() -> _Index:
    return _Index()


def _check_file(page: Path, index: _Index) -> tuple[list[str], int]:
    return _check_page(page.read_text(encoding="utf-8"), str(page.relative_to(ROOT)), index)


@pytest.mark.parametrize("page", _doc_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_code_names_in_docs_exist(page: Path, index: _Index) -> None:
    """Every path, module and code name a page cites exists (rules A-E above)."""
    problems, _ = _check_file(page, index)
    assert not problems, "\n".join(problems)


def test_code_name_check_reads_the_docs(index: _Index) -> None:
    """The check would pass vacuously if the span patterns stopped matching."""
    assert sum(_check_file(p, index)[1] for p in _doc_pages()) >= 250


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        # A: a path that is not there; a bare file name in no cited directory
        ("`lab/serve/nothing.py` is gone", "lab/serve/nothing.py does not exist"),
        ("`lab/serve/router.py` and `nothing.py`", "no such file in a directory"),
        # B: a dotted module name whose definition or member is missing
        ("`lab.serve.router.no_such_thing`", "defines no no_such_thing"),
        ("`mocker.server.config.ServerConfig.nope`", "class ServerConfig has no member nope"),
        # C: module.name against the cited file of that stem
        ("`lab/serve/request_plane/frames.py` ... `frames.no_end`", "defines no no_end"),
        # D: a name next to a file, defined elsewhere (the issue's `Worker.handle`)
        ("(`lab/serve/sidecar/sidecar.py`, `Worker.handle`)", "defines no Worker (cited next"),
        ("`handle_it` in `lab/serve/sidecar/sidecar.py`", "defines no handle_it (cited next"),
        ("`launch/commands.py`: `engine_settings`, `gone_settings`", "defines no gone_settings"),
        # E: a class (or member) that exists nowhere
        ("lands in `App._generate`", "no class App"),
        ("a `FrontendApp.generate` call", "class FrontendApp (lab/serve/frontend/app.py) has no"),
        ("the `NoSuchThing` object", "defined nowhere"),
    ],
)
def test_a_missing_name_fails_naming_page_line_and_name(
    line: str, expected: str, index: _Index
) -> None:
    problems, _ = _check_page(f"# Page\n\n{line}\n", "docs/x.md", index)
    assert len(problems) == 1, problems
    assert problems[0].startswith("docs/x.md:3: `"), problems
    assert expected in problems[0], problems


@pytest.mark.parametrize(
    "line",
    [
        # what exists, in each rule's form
        "(`lab/serve/sidecar/sidecar.py`, `Sidecar.handle`); `lab/serve/sidecar/`",
        "`lab/nagle/stats.py`, `verdict.py`, `words.py`",
        "`python -m tests.bench.h2grpc_bench`; `mocker.server.recorder.list_recorded`",
        "`lab/serve/request_plane/sockets.py`; `sockets.FramedConnection.queue_frame`",
        "`with_request_times` in `lab/analysis/request_times.py`",
        "`lab/shared/settings.py` `SocketSettings`: `client_nodelay`, `split_writes`",
        "`FrontendApp.health_state`, `LiveRequest.tokens`, `KvSessionRef.attributes_struct`",
        "`Control.Abort`, `GetLoad`, `TokenOutput`, `proto/openengine/v1/*.proto`",
        # what the rule leaves alone: keys, API fields, sysctls, run-directory files, code blocks
        "`request_id`, `stream_options.include_usage`, `net.ipv4.tcp_pingpong_thresh`",
        "`lab/analysis/rundir.py` names `config.json` and `levels.csv`",
        "`lab/serve/tokenizer.py`\n\n    `NoSuchThing` in an indented code block\n",
        "```\n`NoSuchThing.at_all` in a fenced block\n```",
    ],
)
def test_what_exists_or_is_not_code_passes(line: str, index: _Index) -> None:
    problems, _ = _check_page(f"# Page\n\n{line}\n", "docs/x.md", index)
    assert not problems, problems
