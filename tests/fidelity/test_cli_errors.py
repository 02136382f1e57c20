"""`lab calibrate` and `lab fidelity`: bad input exits 2 with a one-line error naming it, before
anything is launched or measured; an unreachable target names --target."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from lab.commands.calibrate import calibrate
from lab.commands.fidelity import fidelity
from tests.usage_errors import assert_usage_error, usage_cases

UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens there


@usage_cases(
    "--target http://127.0.0.1:9 --context-isl 64,x",
    "--target http://127.0.0.1:9 --context-isl 0,64",
    "--target http://127.0.0.1:9 --batch-conc ,",
    "--target http://127.0.0.1:9 --context-osl 1",
    "--target http://127.0.0.1:9 --lab-path-ms nan",
    "--target http://127.0.0.1:9 --lab-path-ms -1",
    "--target http://127.0.0.1:9 --engine-type sglang",
    "--target http://127.0.0.1:9 --request-after-share 1.5",
    "--target http://127.0.0.1:9 --request-after-share half",
    ("--target http://127.0.0.1:9 --quiet", "--target"),
)
def test_calibrate_usage_errors(args: list[str], named: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(calibrate, [*args, "--out", str(tmp_path / "run")])
    assert_usage_error(result.exit_code, result.output, named)
    assert not (tmp_path / "run").exists()


def test_fidelity_refuses_a_missing_engine_args_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(fidelity, ["--target", UNREACHABLE, "--engine-args",
                                           str(tmp_path / "nope.json")])
    assert_usage_error(result.exit_code, result.output, "--engine-args")
    assert "nope.json" in result.output


def test_fidelity_refuses_engine_args_whose_profile_does_not_load(tmp_path: Path) -> None:
    bad_csv = tmp_path / "profile.csv"
    bad_csv.write_text("kind,tokens,ms\nprefill,10,5\n")  # no decode rows
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"timing": {"type": "profile", "path": str(bad_csv)}}))
    result = CliRunner().invoke(fidelity, ["--target", UNREACHABLE, "--engine-args", str(args)])
    assert_usage_error(result.exit_code, result.output, "--engine-args")
    assert "no decode rows" in result.output


def test_fidelity_refuses_an_unknown_engine_arg(tmp_path: Path) -> None:
    result = CliRunner().invoke(fidelity, ["--target", UNREACHABLE, "--engine-args",
                                           '{"num_gpu_blockz": 5}'])
    assert_usage_error(result.exit_code, result.output, "--engine-args")
    assert "num_gpu_blockz" in result.output


def test_fidelity_names_an_unreachable_target(tmp_path: Path) -> None:
    result = CliRunner().invoke(fidelity, ["--target", UNREACHABLE, "--quiet", "--out",
                                           str(tmp_path / "run")])
    assert_usage_error(result.exit_code, result.output, "--target")
    assert not (tmp_path / "run").exists()

