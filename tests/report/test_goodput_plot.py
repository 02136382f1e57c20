"""The throughput plot draws goodput beside throughput when the run has SLOs."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from lab.report import plots


def _labels(monkeypatch: pytest.MonkeyPatch, table: pd.DataFrame, path: Path) -> list[str]:
    seen: list[str] = []
    save = plots._save

    def keep(fig, p):  # the figure's series, as drawn, before it is closed
        seen.extend(line.get_label() for ax in fig.axes for line in ax.get_lines())
        return save(fig, p)

    monkeypatch.setattr(plots, "_save", keep)
    plots.throughput_vs_concurrency(table, path)
    return seen


def test_goodput_is_a_series_of_the_throughput_plot(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    table = pd.DataFrame({"concurrency": [1, 2, 4], "req_s": [10.0, 19.0, 20.0],
                          "out_tok_s": [100.0, 190.0, 200.0],
                          "goodput_req_s": [10.0, 18.0, 5.0]})
    labels = _labels(monkeypatch, table, tmp_path / "t.png")
    assert "goodput (every SLO met), requests/s" in labels and (tmp_path / "t.png").exists()
    without = _labels(monkeypatch, table.drop(columns="goodput_req_s"), tmp_path / "u.png")
    assert not any("goodput" in label for label in without)
