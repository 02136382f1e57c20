"""The committed lab/wire/gen is exactly what `python -m lab.wire.generate` makes."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from lab.wire import generate as gen

COMMITTED = gen.DEFAULT_OUT


def _py_files(root: Path) -> dict[Path, bytes]:
    return {
        p.relative_to(root): p.read_bytes()
        for p in sorted(root.rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def test_committed_code_matches_a_fresh_generation(tmp_path: Path) -> None:
    gen.generate(tmp_path)
    fresh, committed = _py_files(tmp_path), _py_files(COMMITTED)
    assert sorted(fresh) == sorted(committed), "run: python -m lab.wire.generate"
    stale = [str(rel) for rel in fresh if fresh[rel] != committed[rel]]
    assert stale == [], f"stale generated files {stale}; run: python -m lab.wire.generate"


def test_generation_is_deterministic(tmp_path: Path) -> None:
    gen.generate(tmp_path / "a")
    gen.generate(tmp_path / "b")
    assert _py_files(tmp_path / "a") == _py_files(tmp_path / "b")


def test_check_reports_changed_missing_and_extra_files(tmp_path: Path) -> None:
    out = tmp_path / "gen"
    shutil.copytree(COMMITTED, out, ignore=shutil.ignore_patterns("__pycache__"))
    runner = CliRunner()
    assert runner.invoke(gen.main, ["--check", "--out", str(out)]).exit_code == 0

    changed = out / "openengine" / "v1" / "generation_pb2.py"
    changed.write_text(changed.read_text() + "# edited\n")
    (out / "openengine" / "v1" / "lora_pb2.py").unlink()
    (out / "openengine" / "v1" / "old_pb2.py").write_text("")
    result = runner.invoke(gen.main, ["--check", "--out", str(out)])
    assert result.exit_code == 1
    for name in ("generation_pb2.py", "lora_pb2.py", "old_pb2.py"):
        assert name in result.output

    # Regenerating in place repairs all three (and deletes the orphan).
    assert runner.invoke(gen.main, ["--out", str(out)]).exit_code == 0
    assert _py_files(out) == _py_files(COMMITTED)


def test_generated_imports_stay_inside_the_package() -> None:
    from lab.wire.gen.loadlab.mocker.v1 import admin_pb2_grpc  # noqa: F401
    from lab.wire.gen.openengine.v1 import generation_pb2, openengine_pb2_grpc  # noqa: F401

    assert "openengine" not in sys.modules
    assert "loadlab" not in sys.modules
    for path in _py_files(COMMITTED):
        text = (COMMITTED / path).read_text()
        assert "\nfrom openengine" not in text and "\nfrom loadlab" not in text, path


def test_rewrite_imports() -> None:
    src = "from openengine.v1 import kv_pb2 as k\nfrom google.protobuf import struct_pb2\n"
    assert gen.rewrite_imports(src) == (
        "from lab.wire.gen.openengine.v1 import kv_pb2 as k\n"
        "from google.protobuf import struct_pb2\n"
    )


def test_missing_proto_dir_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(gen.GenerateError, match="proto directory not found"):
        gen.generate(tmp_path / "out", proto_dir=tmp_path / "nope")
