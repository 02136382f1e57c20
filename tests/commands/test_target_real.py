"""`lab sweep --target` and `lab nagle --target` against a fake server that behaves like the real
ones (tests/load/strict_openai.py: refuses token-id prompts, rejects stream_options, no usage in
streams, counts prompt tokens with a real tokenizer.json), run with their defaults; the one
target check's failure messages; a run where every request fails."""

from __future__ import annotations

import json
import os
import statistics
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from lab.commands.report import report
from lab.commands.sweep import sweep
from lab.nagle.command import nagle
from tests.load.small_tokenizer import make_tokenizer
from tests.procs import Proc

ROOT = Path(__file__).resolve().parents[2]
ENV = {"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture
def strict(spawn: Callable[..., Proc], tok_dir: Path) -> Callable[..., str]:
    def start(*flags: str) -> str:
        proc = spawn("strict-openai", ["python", "-m", "tests.load.strict_openai", "--port", "0",
                                       "--tokenizer", str(tok_dir), *flags], env=ENV)
        return f"http://{proc.address}"
    return start


def run(cmd: object, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cmd, list(args))  # type: ignore[arg-type]
    assert "Traceback" not in result.output, result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def server_prompt_tokens(url: str) -> list[int]:
    with urllib.request.urlopen(url + "/debug/prompt_tokens", timeout=10) as resp:
        return json.loads(resp.read())


SMALL = ("--conc", "1,2", "--requests", "10", "--warmup", "1", "--osl", "6", "--quiet",
         "--no-plots")


def test_sweep_with_defaults_and_tokenizer_is_exact(strict: Callable[..., str], tok_dir: Path,
                                                    tmp_path: Path) -> None:
    url = strict()
    out = tmp_path / "run"
    code, text = run(sweep, "--target", url, "--tokenizer", str(tok_dir), "--isl", "50", *SMALL,
                     "--out", str(out))
    assert code == 0, text
    req = pd.read_parquet(out / "requests.parquet")
    assert req["ok"].all() and (req["output_tokens"] == 6).all()
    assert (req["output_tokens_source"] == "chunks").all()  # no usage in the stream: counted
    # every request, the probe's too, had exactly ISL tokens in the server's tokenizer
    counts = server_prompt_tokens(url)
    assert len(counts) == 1 + len(req) and set(counts) == {50}
    config = json.loads((out / "config.json").read_text())
    check = config["sweep"]["target_check"]
    assert check["include_usage"] is False and check["model"] == "strict-model"
    assert config["sweep"]["workload"]["prompt_kind"] == "text"
    md = (out / "report.md").read_text()
    assert "## Prompt and completion tokens" in md and "reported no usage" in md


def test_sweep_flags_prompt_tokens_that_are_off(strict: Callable[..., str], tok_dir: Path,
                                                tmp_path: Path) -> None:
    url = strict("--stream-usage")
    code, text = run(sweep, "--target", url, "--isl", "60", *SMALL, "--out", str(tmp_path / "a"))
    assert code == 0, text
    md = (tmp_path / "a" / "report.md").read_text()
    assert "**> 2% off**" in md and "try --tokenizer" in md, md  # lab words are not BPE tokens
    code, text = run(sweep, "--target", url, "--isl", "60", "--tokenizer", str(tok_dir), *SMALL,
                     "--out", str(tmp_path / "b"))
    assert code == 0, text
    md = (tmp_path / "b" / "report.md").read_text()
    assert "| 1 | 60.0 | 60.0 | +0.0% | 6.0 | 6.0 | +0.0% |  |" in md, md
    assert "2% off**" not in md


def test_chat_template_overhead_is_stated(strict: Callable[..., str], tok_dir: Path,
                                          tmp_path: Path) -> None:
    url = strict("--stream-usage")
    out = tmp_path / "chat"
    code, text = run(sweep, "--target", url, "--endpoint", "chat", "--isl", "40",
                     "--tokenizer", str(tok_dir), *SMALL, "--out", str(out))
    assert code == 0, text
    overhead = statistics.median(n - 40 for n in server_prompt_tokens(url))
    assert overhead > 0
    md = (out / "report.md").read_text()
    assert f"chat template overhead: {overhead:g} prompt tokens per request" in md, md
    assert "2% off**" not in md


def test_nagle_with_defaults_reaches_a_verdict(strict: Callable[..., str],
                                               tmp_path: Path) -> None:
    url = strict()
    out = tmp_path / "nagle"
    code, text = run(nagle, "--target", url, "--requests", "30", "--osl", "4", "--many", "4",
                     "--gap-ms", "5", "--out", str(out))
    assert code == 0, text
    doc = json.loads((out / "nagle.json").read_text())
    assert doc["model"] == "strict-model" and not doc["errors"]
    assert doc["verdict"]["outcome"] in ("no stall", "stall present"), doc["verdict"]
    md = (out / "report.md").read_text()
    # the non-streaming arm's usage tells the server's prompt tokens: without --tokenizer the
    # corpus words split into several tokens of this small BPE each, and the report flags it
    assert "## Prompt and completion tokens: requested vs server-reported (all arms)" in md, md
    assert "**> 2% off**" in md and "try --tokenizer" in md, md
    config = json.loads((out / "config.json").read_text())
    assert config["nagle"]["prompt_kind"] == "text"
    assert config["nagle"]["target_check"]["include_usage"] is False


@pytest.mark.parametrize(("flags", "args", "needles"), [
    ((), ("--prompt-kind", "token_ids"),
     ("'--prompt-kind'", "HTTP 400", "token-id prompts are not supported", "/v1/completions")),
    (("--no-stream",), (), ("'--target'", "HTTP 200 but no SSE events", "does not stream")),
    ((), ("--model", "llama"), ("'--model'", "does not serve model 'llama'", "strict-model")),
    (("--no-models",), (), ("'--model'", "/v1/models answered HTTP 404")),
    (("--fail-after", "0"), (), ("'--target'", "HTTP 503", "the engine is overloaded")),
])
@pytest.mark.parametrize("command", ["sweep", "nagle"])
def test_probe_failures_name_status_error_and_option(
        strict: Callable[..., str], tmp_path: Path, command: str, flags: tuple[str, ...],
        args: tuple[str, ...], needles: tuple[str, ...]) -> None:
    url = strict(*flags)
    out = tmp_path / "never"
    code, text = run(sweep if command == "sweep" else nagle, "--target", url, *args,
                     "--out", str(out))
    assert code == 2, text
    for needle in needles:
        assert needle in text, (needle, text)
    assert not out.exists()


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_refused_field_is_quoted_not_answered_with_an_endpoint_guess(
        strict: Callable[..., str], tmp_path: Path, endpoint: str) -> None:
    # Dynamo's frontend refused every request of a disaggregated stack on both endpoints; the
    # probe used to advise switching --endpoint, which cannot help.
    url = strict("--refuse-min-tokens")
    code, text = run(sweep, "--target", url, "--endpoint", endpoint, "--out",
                     str(tmp_path / "never"))
    assert code == 2, text
    for needle in ("'--target'", "HTTP 400", "min_tokens", "refused", "max_tokens = min_tokens"):
        assert needle in text, (needle, text)
    assert "try --endpoint" not in text, text


def test_unreachable_and_bad_urls() -> None:
    for cmd in (sweep, nagle):
        code, text = run(cmd, "--target", "http://127.0.0.1:9")
        assert code == 2 and "'--target'" in text and "cannot reach http://127.0.0.1:9" in text
        code, text = run(cmd, "--target", "ftp://x")
        assert code == 2 and "'--target'" in text and "not an http(s) URL" in text


def test_every_request_failing_gives_a_report_not_a_traceback(
        strict: Callable[..., str], tmp_path: Path) -> None:
    url = strict("--fail-after", "1")  # the probe passes, then every request gets a 503
    out = tmp_path / "failed"
    code, text = run(sweep, "--target", url, "--conc", "1,4", "--requests", "5", "--out",
                     str(out), "--quiet")
    assert code == 1, text
    assert "c=1: every request failed (6 x http_503: service_unavailable: the engine is " \
           "overloaded)" in text and "the sweep stopped there" in text, text
    assert ("| 1 | 0.0 | 0 | - | - | - | - | - | - | - | - | - | - | - | 5 (http_503: 5) |"
            in text), text
    md = (out / "report.md").read_text()
    assert "**c=1: every request failed (5 x http_503" in md, md
    levels = pd.read_csv(out / "levels.csv")
    assert levels["concurrency"].tolist() == [1] and levels["failed"].tolist() == [5]
    code, text = run(report, str(out))
    assert code == 0, text
    assert "every request failed" in (out / "report.md").read_text()


def test_bad_tokenizer_options_name_the_option(tok_dir: Path, tmp_path: Path) -> None:
    for cmd in (sweep, nagle):
        code, text = run(cmd, "--target", "http://127.0.0.1:9", "--tokenizer", str(tmp_path))
        assert code == 2 and "'--tokenizer'" in text and "no tokenizer.json" in text, text
        code, text = run(cmd, "--target", "http://127.0.0.1:9", "--tokenizer", str(tok_dir),
                         "--prompt-kind", "words")
        assert code == 2 and "'--prompt-kind'" in text and "use text or token_ids" in text, text
