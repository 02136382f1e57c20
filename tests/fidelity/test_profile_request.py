"""The profile timing model's optional `request` rows (mocker/engine/timing.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mocker.engine.config import EngineArgs
from mocker.engine.timing import TimingModel


def _model(tmp_path: Path, rows: str, speedup: float = 1.0) -> TimingModel:
    csv = tmp_path / "p.csv"
    csv.write_text("kind,tokens,ms\nprefill,100,10\ndecode,100,2\n" + rows)
    return TimingModel(EngineArgs(speedup_ratio=speedup,
                                  timing={"type": "profile", "path": str(csv)}))


def test_request_rows_interpolate_over_prompt_tokens_and_scale(tmp_path: Path) -> None:
    model = _model(tmp_path, "request,100,40\nrequest,300,20\n")
    assert model.request_ms(200) == pytest.approx(30.0)
    assert model.request_ms(1000) == 0.0  # extrapolated below 0: floored
    assert _model(tmp_path, "request,1,40\n", speedup=2.0).request_ms(50) == 20.0
    assert _model(tmp_path, "request,1,40\n", speedup=0.0).request_ms(50) == 0.0


def test_without_request_rows_there_is_no_latency(tmp_path: Path) -> None:
    assert _model(tmp_path, "").request_ms(100) == 0.0
    assert TimingModel(EngineArgs()).request_ms(100) == 0.0


def test_an_unknown_kind_names_the_three(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="prefill, decode or request"):
        _model(tmp_path, "queue,1,5\n")
