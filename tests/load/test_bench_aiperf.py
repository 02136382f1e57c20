"""`python -m tests.bench.bench_aiperf`: bad input is a usage error naming the option, checked
before anything is run against the target (the benchmark itself needs the Dynamo anchor and
AIPerf: docs/open-loop.md "Against AIPerf")."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from tests.bench.bench_aiperf import main
from tests.usage_errors import assert_usage_error


def _invoke(tmp_path: Path, *args: str) -> tuple[int | None, str]:
    anchors = tmp_path / "anchors"
    anchors.mkdir(exist_ok=True)
    (anchors / "aiperf.sh").touch()
    model = tmp_path / "anchor" / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "tokenizer.json").write_text("{}")
    base = ["--target", "http://127.0.0.1:9", "--anchors", str(anchors), "--anchor-dir",
            str(model.parent), "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(main, [*base, *args])
    return result.exit_code, result.output


def test_bad_rates_are_usage_errors(tmp_path: Path) -> None:
    code, out = _invoke(tmp_path, "--rate", "0,abc")
    assert_usage_error(code, out, "--rate")


def test_an_anchor_dir_without_the_tokenizer_is_named(tmp_path: Path) -> None:
    code, out = _invoke(tmp_path, "--anchor-dir", str(tmp_path / "nothing"))
    assert_usage_error(code, out, "--anchor-dir")
    assert "tokenizer.json" in out


def test_a_used_out_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "old").touch()
    code, out = _invoke(tmp_path, "--rate", "10")
    assert_usage_error(code, out, "--out")


def test_aiperf_runs_with_the_options_that_cut_its_cpu(tmp_path: Path) -> None:
    """run_aiperf hands aiperf.sh the rate, the arrival and AIPERF_LEAN_ARGS (a stand-in
    aiperf.sh records its argv and writes the summary.json a real one would)."""
    from tests.bench.bench_aiperf import AIPERF_LEAN_ARGS, run_aiperf

    anchors = tmp_path / "anchors"
    anchors.mkdir()
    script = anchors / "aiperf.sh"
    script.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$5/argv"\n'
                      'echo \'{"req_s": 50.0, "ttft_p50_ms": 4.0, "client_cpu_pct": 25.0, '
                      '"errors": 0}\' > "$5/summary.json"\n')
    script.chmod(0o755)
    out = tmp_path / "run"
    out.mkdir()
    r = run_aiperf(anchors, tmp_path, "http://127.0.0.1:9", "m", out, 50.0, 100, 8)
    argv = (out / "argv").read_text().split("\n")[:-1]
    assert argv[5:] == ["--request-rate", "50", "--arrival-pattern", "poisson",
                        *AIPERF_LEAN_ARGS]
    assert "--no-server-metrics" in argv and "summary" in argv
    assert r["cpu_ms"] == 5.0  # 25% of a core at 50 req/s
