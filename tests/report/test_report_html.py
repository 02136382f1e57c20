"""report.html and compare.html: one self-contained file each, checked in a real browser
(Debian's headless Chromium): it renders, every plot loads with a nonzero size, the console has
no error, and the page asks for nothing but itself (the file is copied alone into an empty
directory first, so a plot that is linked rather than embedded fails to load)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from click.testing import CliRunner

from lab.commands.compare import compare
from lab.commands.report import report
from tests.report.browser import PageSeen, chromium_or_skip, open_in_chromium
from tests.report.test_report_rebuild import REF, synth_run


def _open_alone(html_file: Path, tmp: Path) -> PageSeen:
    alone = tmp / "alone"
    alone.mkdir()
    copy = alone / html_file.name
    shutil.copy(html_file, copy)
    return open_in_chromium(copy)


def _assert_readable(seen: PageSeen, markdown: str, page: Path) -> None:
    plots = re.findall(r"^!\[([^\]]*)\]\(", markdown, flags=re.M)
    assert plots, "the markdown names no plot"
    assert [i["alt"] for i in seen.images] == plots
    for img in seen.images:
        assert img["complete"] and img["width"] > 100 and img["height"] > 100, img
    assert seen.errors == []
    assert all(u == page.resolve().as_uri() or u.startswith("data:") for u in seen.urls), \
        seen.urls
    assert seen.screenshot.startswith(b"\x89PNG")


def test_report_html_renders_in_chromium_with_every_plot(tmp_path: Path) -> None:
    chromium_or_skip()
    run = tmp_path / "run"
    synth_run(run, REF)
    result = CliRunner().invoke(report, [str(run)])
    assert result.exit_code == 0, result.output
    seen = _open_alone(run / "report.html", tmp_path)
    _assert_readable(seen, (run / "report.md").read_text(), tmp_path / "alone" / "report.html")
    # the tables and sentences are there as text, not as markdown source
    assert "knee at 128" in seen.text
    assert "req/s\tout tok/s" in seen.text  # a table's header row, cells tab-separated
    assert "|---" not in seen.text and "**" not in seen.text


def test_compare_html_renders_in_chromium_with_every_plot(tmp_path: Path) -> None:
    chromium_or_skip()
    synth_run(tmp_path / "a", {1: 22.0, 32: 500.0, 128: 1000.0}, mode="aggregated")
    synth_run(tmp_path / "b", {32: 479.5, 128: 882.0}, mode="disaggregated", seed=1)
    result = CliRunner().invoke(compare, [str(tmp_path / "a"), str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    out = tmp_path / "a" / "compare"
    seen = _open_alone(out / "compare.html", tmp_path)
    _assert_readable(seen, (out / "compare.md").read_text(), tmp_path / "alone" / "compare.html")
    assert "disaggregated costs" in seen.text
