"""The report's sentences about the client and the per-level request count."""

from __future__ import annotations

import pandas as pd

from lab.report.build import _setup_lines
from lab.report.markdown import client_sentence, delivery_sentence, server_wait_sentence


def _levels(lag_ms: float, ttft_ms: float, cpu_pct: float = 20.0,
            itl_ms: float = 10.0) -> pd.DataFrame:
    return pd.DataFrame([{"concurrency": 32, "client_cpu_pct_max_proc": cpu_pct,
                          "loop_lag_p99_ms": lag_ms, "ttft_ms_p50": ttft_ms,
                          "itl_ms_p50": itl_ms, "client_cpu_ms_per_req": 1.0}])


def test_a_loop_lag_small_beside_the_ttft_is_not_called_a_cpu_shortage() -> None:
    # 5 ms of lag against a 150 ms TTFT: at most 3% of the figure the level reports
    assert client_sentence(_levels(5.0, 150.0)).startswith("the client kept up")


def test_a_loop_lag_large_beside_the_ttft_is_flagged_with_both_figures() -> None:
    text = client_sentence(_levels(5.0, 20.0))
    assert "short of CPU" in text
    assert "loop lag p99 5.0 ms against TTFT p50 20.0 ms" in text
    assert "above 10% of the level's TTFT p50" in text


def test_a_loop_lag_above_the_token_gap_is_flagged_even_beside_a_long_ttft() -> None:
    # vLLM on 2 cores (docs/fidelity.md "The client's scheduling"): a 3.6 s stall inflated the
    # TTFT it hid behind (128 ms of lag p99 against a TTFT p50 of 2.7 s), and its lag p99 was
    # far above the level's ITL p50 of 5.6 ms
    text = client_sentence(_levels(127.6, 2676.0, cpu_pct=1.0, itl_ms=5.6))
    assert "short of CPU" in text
    assert "loop lag p99 127.6 ms against TTFT p50 2,676 ms, ITL p50 5.6 ms" in text
    assert "--client-realtime runs the client ahead of it" in text  # what to do about it
    assert client_sentence(_levels(1.2, 2676.0, itl_ms=5.0)).startswith("the client kept up")


def test_a_busy_client_is_the_bottleneck_whatever_the_lag() -> None:
    assert "the client was the bottleneck" in client_sentence(_levels(0.1, 100.0, cpu_pct=95))


def test_the_header_states_the_request_count_it_used_when_left_at_the_default() -> None:
    requests = pd.DataFrame({"concurrency": [1] * 101 + [32] * 257,
                             "warmup": [True] + [False] * 100 + [True] + [False] * 256,
                             "ok": True})
    lines = _setup_lines({"sweep": {"requests": None, "warmup": None}}, requests)
    per_level = next(line for line in lines if line.startswith("per level:"))
    assert "None" not in per_level
    assert per_level.startswith("per level: 100, 256 requests (--requests not given")
    given = _setup_lines({"sweep": {"requests": 50, "warmup": 0}}, requests)
    assert any(line.startswith("per level: 50 requests + warm-up 0") for line in given)


def test_the_delivery_sentence_names_an_open_loop_level_by_its_rate() -> None:
    levels = pd.DataFrame([{"concurrency": 0, "rate": 7.0, "tokens_per_chunk": 1.4},
                           {"concurrency": 0, "rate": 14.0, "tokens_per_chunk": 1.0}])
    text = delivery_sentence(levels, None)
    assert "above one token per event at rate=7/s (1.40):" in text
    assert "c=0" not in text


def test_server_wait_names_each_process_and_level_past_the_share() -> None:
    levels = pd.DataFrame([
        {"concurrency": 1, "cpu_pct:worker": 90.0, "cpu_wait_pct:worker": 5.0,
         "cpu_pct:frontend": 10.0, "cpu_wait_pct:frontend": 1.0},
        {"concurrency": 8, "cpu_pct:worker": 75.0, "cpu_wait_pct:worker": 25.0,
         "cpu_pct:frontend": 30.0, "cpu_wait_pct:frontend": 2.0}])
    text = server_wait_sentence(levels)
    assert text is not None and text.startswith("server CPU wait: worker at c=8 (25%) of")
    assert "frontend" not in text and "c=1" not in text
    calm = levels.assign(**{"cpu_wait_pct:worker": [5.0, 5.0]})
    assert server_wait_sentence(calm) == ("server CPU wait: no server process waited for a CPU "
                                          "10% of the time it was runnable (at most 9%).")
    assert server_wait_sentence(levels.drop(columns=["cpu_wait_pct:worker",
                                                     "cpu_wait_pct:frontend"])) is None
