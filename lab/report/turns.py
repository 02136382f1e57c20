"""The per-turn table of a `--turns` run, in report.md and `lab report`'s output."""

from __future__ import annotations

import pandas as pd

from lab.analysis.levels import level_label
from lab.report.markdown import fnum, md_table


def turns_table(turns: pd.DataFrame) -> str:
    """Per level and turn: requests, server-reported prompt tokens p50, TTFT p50/p99, latency
    p50 (lab.analysis.turns.per_turn)."""
    header = ["Level", "Turn", "requests", "prompt tokens p50 (server)", "TTFT p50 ms", "p99",
              "Latency p50 ms"]
    rows = [[level_label(r), str(int(r["turn"])), str(int(r["requests"])),
             fnum(r["prompt_tokens_p50"], 0), fnum(r["ttft_ms_p50"], 2),
             fnum(r["ttft_ms_p99"], 2), fnum(r["latency_ms_p50"])]
            for _, r in turns.iterrows()]
    return md_table(header, rows)


def turns_markdown(turns: pd.DataFrame) -> str:
    return ("Each turn carries the conversation's history (the earlier messages and answers), so "
            "the prompt grows turn by turn; the prompt tokens are the server's own count "
            "(usage), '-' when it reported none.\n\n" + turns_table(turns) + "\n")
