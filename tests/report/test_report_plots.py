"""What a reader sees on a run's plots: one colour per level on every panel and plot, the
timeline's bins sized to each level (a level of a second is a curve, not one or two points),
and every legend beside the data, never over it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from matplotlib.colors import to_hex

from lab.analysis import rundir
from lab.analysis.timeline import BINS_PER_LEVEL, run_timeline
from lab.open_loop import report as open_loop_report
from lab.report import plots
from lab.report.build import build_run
from tests.report.test_report_rebuild import REF, synth_run


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, plt.Figure],
                                                                      dict[str, str]]]:
    """One synthetic run's report built once: every figure it saves, by file name (kept open
    to be read), and the run's level colours."""
    seen: dict[str, plt.Figure] = {}

    def keep(fig: plt.Figure, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.tight_layout()
        fig.savefig(path, dpi=40)  # the report names it; the figure stays open to be read
        seen[path.name] = fig
        return path

    run = tmp_path_factory.mktemp("plots") / "run"
    synth_run(run, REF)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plots, "_save", keep)
        mp.setattr(open_loop_report, "_save", keep)
        build_run(run)
    yield seen, plots.run_level_colors(rundir.read_requests(run))
    for fig in seen.values():
        plt.close(fig)


def test_timeline_bins_are_sized_to_each_level(tmp_path: Path) -> None:
    synth_run(tmp_path / "run", REF)
    requests = rundir.read_requests(tmp_path / "run")
    per_second = run_timeline(requests)
    binned = run_timeline(requests, level_bins=True)
    for c, g in binned.groupby("concurrency"):
        level = requests[requests["concurrency"] == c]
        assert 4 <= len(g) <= BINS_PER_LEVEL + 2, (c, len(g))
        assert g["sent"].sum() == len(level)  # every request in exactly one bin
        if c > 1:  # these levels last under a second: one-second bins draw one or two points
            assert len(per_second[per_second["concurrency"] == c]) <= 2
    assert set(per_second["bin_s"]) == {1.0}


def test_each_level_has_one_colour_on_every_panel_and_plot(
        built: tuple[dict[str, plt.Figure], dict[str, str]]) -> None:
    figures, colors = built
    assert len(set(colors.values())) == len(REF) == len(colors)
    for ax in figures["timeline.png"].axes:
        drawn = {to_hex(line.get_color()) for line in ax.get_lines()}
        assert drawn == set(colors.values()), ax.get_ylabel()
    for name in ("ttft.png", "chunk_gaps.png"):
        legend = figures[name].axes[-1].get_legend()
        assert {t.get_text(): to_hex(h.get_color()) for t, h in
                zip(legend.get_texts(), legend.get_lines(), strict=True)} == colors, name


def test_every_legend_sits_beside_the_data(
        built: tuple[dict[str, plt.Figure], dict[str, str]]) -> None:
    figures, _ = built
    assert {"timeline.png", "throughput.png", "latency_vs_throughput.png", "ttft.png",
            "chunk_gaps.png"} <= set(figures)
    for name, fig in figures.items():
        renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
        legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
        assert legends, name
        for legend in legends:
            box = legend.get_window_extent(renderer)
            for ax in fig.axes:
                assert not box.overlaps(ax.get_window_extent(renderer)), name
