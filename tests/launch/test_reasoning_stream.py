"""Reasoning streams over the real path (docs/mocker.md "Reasoning spans", docs/metrics.md
"Reasoning"): the launcher starts `mocker serve` with a reasoning span in its engine args and
turns the frontend's parser on, the engine emits the span, its think-end marker and the answer,
the frontend streams them as `delta.reasoning_content` then `delta.content`, and the load
client stamps the first reasoning and the first answer chunk apart."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from lab.analysis.metrics import REASONING_LEVEL_COLUMNS, level_summary
from lab.analysis.request_times import requests_frame
from lab.load.client import run_level
from lab.load.record import rows
from lab.load.sse import RawResponse, parse_response
from lab.report.markdown import delivery_sentence
from lab.shared.engine_settings import EngineSettings
from lab.shared.reasoning import THINK_END_TEXT, think_end_id
from launch.stack import Stack
from launch.topology import TopologySpec
from mocker.engine import EngineArgs
from mocker.server.config import ServerConfig, SettingError
from tests.load.small_tokenizer import make_tokenizer

pytestmark = [pytest.mark.usefixtures("no_leftovers")]

#: a known engine speed: every decode pass 20 ms (speedup 1)
DECODE_MS = 20.0
SPAN = 10  # reasoning tokens, then the marker, then the answer
OSL = 20
ENGINE_ARGS = {"reasoning_tokens": SPAN,
               "timing": {"type": "fixed", "prefill_ms": 5.0, "decode_ms": DECODE_MS}}
FAST = dict(speedup=1, grace_s=8, extra_sidecar_args=["--grace-period", "0.5"],
            extra_frontend_args=["--shutdown-grace", "0.5"])


def body(endpoint: str) -> dict:
    b: dict = {"model": "mocker-model", "max_tokens": OSL, "min_tokens": OSL, "ignore_eos": True,
               "stream": True, "stream_options": {"include_usage": True}}
    if endpoint == "chat":
        b["messages"] = [{"role": "user", "content": "one two three four"}]
    else:
        b["prompt"] = "one two three four"
    return b


async def test_reasoning_and_answer_first_token_times_over_the_real_path(tmp_path: Path) -> None:
    spec = TopologySpec.aggregated(engine_args=ENGINE_ARGS, **FAST)
    async with Stack(spec, tmp_path / "run") as stack:
        chat = await run_level(stack.frontend_url, [body("chat")] * 3, 1)
        plain = await run_level(stack.frontend_url, [body("completions")], 1)
    for r in chat.records:
        assert r.ok, r.error_message
        assert r.output_tokens == OSL  # usage: the span, the marker and the answer
        assert r.chunks == OSL - 1  # the marker is no event
        assert r.reasoning_chunks == SPAN
        assert r.first_reasoning_ns == r.first_ns  # TTFT: the first token of any kind
        assert r.first_answer_ns is not None and r.first_ns is not None
        # the first answer token leaves SPAN passes after the first reasoning token (the
        # marker's pass, then the answer's first): SPAN x 20 ms at speedup 1
        gap_ms = (r.first_answer_ns - r.first_ns) / 1e6
        assert 0.8 * SPAN * DECODE_MS <= gap_ms <= SPAN * DECODE_MS + 150, gap_ms
    # the completions endpoint has no reasoning parser: every token is text, marker included
    [p] = plain.records
    assert p.ok and p.chunks == OSL and p.reasoning_chunks == 0 and p.first_reasoning_ns is None
    assert p.first_answer_ns == p.first_ns
    level = level_summary(requests_frame(rows(chat.records)))
    assert set(REASONING_LEVEL_COLUMNS) <= set(level)
    assert level["reasoning_chunks_mean"] == SPAN
    assert level["answer_chunks_mean"] == OSL - 1 - SPAN
    assert level["ttfo_ms_p50"] - level["ttfr_ms_p50"] >= 0.8 * SPAN * DECODE_MS


def _stream(*events: bytes) -> RawResponse:
    pieces = [b"data: " + e + b"\n\n" for e in (*events, b"[DONE]")]
    return RawResponse(sent_ns=0, status=200, times=[10 * (i + 1) for i in range(len(pieces))],
                       pieces=pieces, done_ns=10 * len(pieces))


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_the_client_reads_both_spellings_of_a_reasoning_delta(field: str) -> None:
    """vLLM and SGLang send `delta.reasoning_content`, newer servers `delta.reasoning`."""
    head = b'{"id":"x","choices":[{"index":0,"delta":{"'
    raw = _stream(head + field.encode() + b'":"hm"}}]}', head + field.encode() + b'":"hm"}}]}',
                  head + b'content":"yes"}}]}', head + b'content":"!"}}]}')
    r = parse_response(raw, streaming=True)
    assert r.ok and r.chunks == 4 and r.reasoning_chunks == 2
    assert (r.first_ns, r.first_reasoning_ns, r.first_answer_ns) == (10, 10, 30)


@pytest.mark.parametrize("args", [{"reasoning_share": 1.5}, {"reasoning_tokens": -1},
                                  {"reasoning_tokens": 4, "reasoning_share": 0.5}])
def test_bad_reasoning_engine_args_are_refused_by_name(args: dict) -> None:
    with pytest.raises(ValueError, match="reasoning_"):
        EngineArgs.from_json(args)


def test_the_think_end_token_without_an_event_is_no_merged_delivery() -> None:
    """32 tokens in 31 events: the marker, not a hop that merged engine steps."""
    level = {"concurrency": 1, "tokens_per_chunk": 32 / 31}
    plain = pd.DataFrame([level])
    reasoning = pd.DataFrame([{**level, "reasoning_chunks_mean": 8.0,
                               "answer_chunks_mean": 23.0}])
    assert "tok/chunk was above" in delivery_sentence(plain, 1)
    assert "every event carried one engine step's tokens" in delivery_sentence(reasoning, 1)


def _tokenizer(directory: Path, think: bool) -> Path:
    """The tests' small HuggingFace tokenizer, with `</think>` as an added (not special) token
    when `think`, as Qwen3's."""
    from tokenizers import Tokenizer

    make_tokenizer(directory)
    if think:
        tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
        tok.add_tokens([THINK_END_TEXT])
        tok.save(str(directory / "tokenizer.json"))
    return directory


def test_a_tokenizers_think_end_token_is_the_marker_and_never_drawn(tmp_path: Path) -> None:
    tok = _tokenizer(tmp_path / "tok", think=True)
    marker = think_end_id(str(tok))
    settings = EngineSettings(tokenizer=str(tok), engine_args='{"reasoning_share": 0.5}')
    cfg = ServerConfig.from_settings(settings)
    assert cfg.think_end == marker and marker not in cfg.allowed_ids
    plain = ServerConfig.from_settings(EngineSettings(tokenizer=str(tok)))
    assert plain.think_end is None and marker in plain.allowed_ids


def test_a_span_without_a_think_end_token_is_refused_by_name(tmp_path: Path) -> None:
    tok = _tokenizer(tmp_path / "tok", think=False)
    settings = EngineSettings(tokenizer=str(tok), engine_args='{"reasoning_tokens": 4}')
    with pytest.raises(SettingError, match=THINK_END_TEXT) as refused:
        ServerConfig.from_settings(settings)
    assert refused.value.option == "--tokenizer"
    frontend = subprocess.run(
        [sys.executable, "-m", "lab", "frontend", "--discovery", f"file:{tmp_path / 'd'}",
         "--tokenizer", str(tok), "--reasoning-parser", "think"],
        capture_output=True, text=True, timeout=60)
    assert frontend.returncode == 2, frontend.stderr
    assert "--reasoning-parser" in frontend.stderr and THINK_END_TEXT in frontend.stderr
    assert "Traceback" not in frontend.stderr
