"""report.html beside report.md (and compare.html beside compare.md): the same document rendered
for a browser, in one self-contained file that reads offline.

The markdown is the one source of the sentences and tables; this module renders the subset of
markdown the lab's reports use (headings, paragraphs, `- ` bullets, pipe tables, `**bold**`,
`code`, links and `![caption](plot.png)` images) to HTML. Each image is read from beside the
markdown and embedded as a data: URI, so the file carries its plots and loads nothing from
anywhere (docs/metrics.md "The report").
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

_IMAGE = re.compile(r"^!\[(?P<alt>[^\]]*)\]\((?P<src>[^)]+)\)$")
_INLINE = re.compile(r"\*\*(?P<bold>.+?)\*\*|`(?P<code>[^`]+)`"
                     r"|\[(?P<text>[^\]]+)\]\((?P<href>[^)]+)\)")
_MIME = {".png": "image/png", ".svg": "image/svg+xml", ".jpg": "image/jpeg"}

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 78em; padding: 0 1em;
       color: #222; line-height: 1.45; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; }
th { background: #f2f2f2; }
td:first-child, th:first-child { text-align: left; }
figure { margin: 1em 0; }
img { max-width: 100%; height: auto; border: 1px solid #eee; }
code { background: #f5f5f5; padding: 0 0.2em; }
.table-wrap { overflow-x: auto; }
"""


class ReportImageMissing(FileNotFoundError):
    """An image the markdown names is not beside it: the HTML would show a broken plot."""


def _inline(text: str) -> str:
    """Escape `text` and render its bold, code and link spans."""
    out, pos = [], 0
    for m in _INLINE.finditer(text):
        out.append(html.escape(text[pos:m.start()]))
        if m.group("bold") is not None:
            out.append(f"<strong>{_inline(m.group('bold'))}</strong>")
        elif m.group("code") is not None:
            out.append(f"<code>{html.escape(m.group('code'))}</code>")
        else:
            out.append(f'<a href="{html.escape(m.group("href"))}">'
                       f"{html.escape(m.group('text'))}</a>")
        pos = m.end()
    out.append(html.escape(text[pos:]))
    return "".join(out)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _is_rule(line: str) -> bool:
    return bool(re.fullmatch(r"\|?(\s*:?-+:?\s*\|)+\s*:?-*:?\s*\|?", line.strip()))


def data_uri(path: Path) -> str:
    mime = _MIME.get(path.suffix.lower(), "application/octet-stream")
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def _image(alt: str, src: str, base: Path) -> str:
    path = base / src
    if not path.is_file():
        raise ReportImageMissing(f"{path}: named by the report but not there")
    return (f'<figure><img alt="{html.escape(alt)}" src="{data_uri(path)}">'
            f"<figcaption>{html.escape(alt)}</figcaption></figure>")


def render_html(markdown: str, base: Path) -> str:
    """The HTML page of `markdown`, its images (paths relative to `base`) embedded."""
    lines = markdown.splitlines()
    body: list[str] = []
    title = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if not stripped:
            i += 1
            continue
        if m := re.match(r"^(#{1,6})\s+(.*)$", stripped):
            level = len(m.group(1))
            title = title or m.group(2)
            body.append(f"<h{level}>{_inline(m.group(2))}</h{level}>")
            i += 1
        elif m := _IMAGE.match(stripped):
            body.append(_image(m.group("alt"), m.group("src"), base))
            i += 1
        elif stripped.startswith("|") and i + 1 < len(lines) and _is_rule(lines[i + 1]):
            header = _cells(stripped)
            rows = []
            i += 2
            while i < len(lines) and lines[i].strip().startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            head = "".join(f"<th>{_inline(c)}</th>" for c in header)
            trs = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>"
                          for r in rows)
            body.append(f'<div class="table-wrap"><table><thead><tr>{head}</tr></thead>'
                        f"<tbody>{trs}</tbody></table></div>")
        elif stripped.startswith("- "):
            items = []
            while i < len(lines) and lines[i].strip().startswith("- "):
                items.append(f"<li>{_inline(lines[i].strip()[2:])}</li>")
                i += 1
            body.append("<ul>" + "".join(items) + "</ul>")
        else:
            para = []
            while (i < len(lines) and lines[i].strip()
                   and not lines[i].strip().startswith(("#", "|", "- ", "!["))):
                para.append(lines[i].strip())
                i += 1
            if not para:  # a line that starts a block but does not parse as one: keep its text
                para.append(stripped)
                i += 1
            body.append(f"<p>{_inline(' '.join(para))}</p>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{html.escape(title)}</title><style>{STYLE}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def write_html(markdown_path: Path) -> Path:
    """Render `markdown_path` (report.md, compare.md) to the .html beside it."""
    out = markdown_path.with_suffix(".html")
    out.write_text(render_html(markdown_path.read_text(), markdown_path.parent))
    return out
