"""report.md and the terminal table: the results table (docs/metrics.md), the knee sentence,
the client-health sentence, per-process CPU, plots, and a fault section when there were faults."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from lab.analysis import catalogue as cat
from lab.analysis.catalogue import Column
from lab.analysis.knee import Knee
from lab.analysis.levels import level_label

CLIENT_CPU_BUSY_PCT = 90.0  # a client process using this much of a core is saturated
#: The client's event-loop lag delays its own stamps by up to the lag. It is flagged when its p99
#: exceeds this share of the level's TTFT p50 (and 1 ms): the lag could then move the level's
#: TTFT by more than that share. Below it, the lag is noise beside what the level measures.
CLIENT_LAG_SHARE_OF_TTFT = 0.10
CLIENT_LAG_FLOOR_MS = 1.0
#: ... or when its p99 exceeds the level's ITL p50: the loop then read tokens in bursts, so the
#: token gaps it stamped are not the server's. The TTFT share alone misses a stall that inflated
#: the TTFT it is compared with (docs/fidelity.md "The client's scheduling").


def _isnum(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def fnum(v: Any, digits: int = 1) -> str:
    if not _isnum(v):
        return "-"
    v = float(v)
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}f}"


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


#: The results table's columns (between the level and the errors), from the catalogue.
RESULTS: tuple[Column, ...] = (
    cat.REQ_S.col(), cat.OUT_TOK_S.col(), cat.LATENCY.col("avg"), cat.LATENCY.col("p99"),
    cat.TTFT.col("avg"), cat.TTFT.col("p50"), cat.TTFT.col("p99"), cat.ITL.col("avg"),
    cat.TOKENS_PER_CHUNK.col(), cat.SERVER_CPU_MS_PER_REQ.col(),
    cat.SERVER_CPU_US_PER_TOKEN.col(), cat.CLIENT_CPU_US_PER_TOKEN.col(),
    cat.TOTAL_CPU_US_PER_TOKEN.col(),
)
#: The client-health table's columns, from the catalogue.
CLIENT_HEALTH: tuple[Column, ...] = (
    cat.CLIENT_CPU_PCT.col(), cat.CLIENT_CPU_PCT_MAX_PROC.col(), cat.CLIENT_CPU_MS_PER_REQ.col(),
    cat.SEND_DELAY.col("p99"), cat.LOOP_LAG_P99.col(),
)


def headings(columns: tuple[Column, ...]) -> list[str]:
    """Each column's catalogue heading; a statistic of the same metric as the column before it
    is named by its statistic alone ('TTFT mean (ms) | p50 | p99'), to keep wide tables short."""
    out = []
    for i, c in enumerate(columns):
        same = i > 0 and columns[i - 1].metric is c.metric and c.stat is not None
        out.append(c.stat_word if same else c.heading)
    return out


def cell(row: pd.Series, column: Column) -> str:
    """`column`'s value in `row`, with the catalogue's digits."""
    return fnum(row.get(column.name), column.metric.digits)


def results_rows(levels: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """The results table (docs/metrics.md): the level, RESULTS, errors (with kinds); req/s with
    its range over repeats. `levels` = by_concurrency() rows; an open-loop run's rows are keyed
    by rate."""
    header = ["Rate" if "rate" in levels else "Conc", *headings(RESULTS), "Errors"]
    req = cat.REQ_S.col()
    rows = []
    for _, r in levels.iterrows():
        cells = [cell(r, c) for c in RESULTS]
        if r.get("repeats", 1) and r.get("repeats", 1) > 1 and _isnum(r.get(f"{req.name}_min")):
            i = RESULTS.index(req)
            cells[i] += (f" ({fnum(r[f'{req.name}_min'], req.metric.digits)}-"
                         f"{fnum(r[f'{req.name}_max'], req.metric.digits)})")
        rows.append([_level_cell(r), *cells, str(r.get("errors", "0"))])
    return header, rows


def _level_cell(r: pd.Series) -> str:
    rate = r.get("rate")
    return f"{rate:g}/s" if _isnum(rate) else str(int(r["concurrency"]))


def _level_name(r: pd.Series) -> str:
    """c=8 or 6.5/s: a level named in a sentence."""
    return _level_cell(r) if _isnum(r.get("rate")) else f"c={_level_cell(r)}"


def results_table(levels: pd.DataFrame) -> str:
    return md_table(*results_rows(levels))


def client_sentence(levels: pd.DataFrame) -> str:
    """Says in words whether the load client limited the measurement: a client process near a
    full core is the bottleneck; an event loop lagging by more than CLIENT_LAG_SHARE_OF_TTFT of
    the level's TTFT p50, or by more than its ITL p50, with an idle client means the machine was
    short of CPU (the client's timestamps then carry that delay)."""
    if not _client_recorded(levels):
        return "client health: not recorded for this run."
    busy, lagging = _client_limits(levels)
    out = []
    if busy:
        out.append("the client was the bottleneck at " + "; ".join(busy) +
                   " (those levels measure the client as much as the server; "
                   "try --client-procs).")
    if lagging:
        out.append("the client's event loop lagged at " + "; ".join(lagging) +
                   f" (above {CLIENT_LAG_SHARE_OF_TTFT:.0%} of the level's TTFT p50, or above "
                   "its ITL p50) while the "
                   "client itself was not busy: "
                   "the machine was short of CPU, so timestamps at those levels carry up to "
                   "that much delay (beside a server that keeps the cores busy, "
                   "--client-realtime runs the client ahead of it).")
    if out:
        return " ".join(out)
    cpu_max = levels["client_cpu_pct_max_proc"].max()
    lag_max = levels["loop_lag_p99_ms"].max() if "loop_lag_p99_ms" in levels else None
    per_req = levels["client_cpu_ms_per_req"].max() if "client_cpu_ms_per_req" in levels else None
    return (f"the client kept up at every level (busiest client process: a core at "
            f"{fnum(cpu_max, 0)}%, loop lag p99 at most {fnum(lag_max, 2)} ms, "
            f"at most {fnum(per_req, 2)} ms of client CPU per request).")


def _client_recorded(levels: pd.DataFrame) -> bool:
    return ("client_cpu_pct_max_proc" in levels
            and not levels["client_cpu_pct_max_proc"].isna().all())


def _client_limits(levels: pd.DataFrame) -> tuple[list[str], list[str]]:
    """The levels where the client was the bottleneck, and those where its event loop lagged
    while it was not busy (the figures of each, for `client_sentence`)."""
    busy: list[str] = []
    lagging: list[str] = []
    for _, r in levels.iterrows():
        cpu = r.get(cat.CLIENT_CPU_PCT_MAX_PROC.name)
        lag = r.get(cat.LOOP_LAG_P99.name)
        ttft = r.get(cat.TTFT.col("p50").name)
        itl = r.get(cat.ITL.col("p50").name)
        figures = (f"{level_label(r)}: a core at {fnum(cpu, 0)}% / "
                   f"loop lag p99 {fnum(lag, 1)} ms")
        if _isnum(cpu) and cpu >= CLIENT_CPU_BUSY_PCT:
            busy.append(figures)
        elif _isnum(lag) and lag > CLIENT_LAG_FLOOR_MS and (
                not _isnum(ttft) or lag > CLIENT_LAG_SHARE_OF_TTFT * ttft
                or (_isnum(itl) and lag > itl)):
            lagging.append(f"{figures} against TTFT p50 {fnum(ttft, 1)} ms, ITL p50 "
                           f"{fnum(itl, 1)} ms")
    return busy, lagging


def client_kept_up(levels: pd.DataFrame) -> bool:
    """False when `client_sentence` would name a level where the client limited the
    measurement (True when client health was not recorded: nothing to say)."""
    if not _client_recorded(levels):
        return True
    busy, lagging = _client_limits(levels)
    return not busy and not lagging


def _think_end_allowance(r: pd.Series) -> float:
    """A reasoning stream's think-end token is a token with no event (docs/mocker.md
    "Reasoning spans"): its level's tokens per event are (events + 1) / events per engine step
    without any merging."""
    reasoning, answer = r.get("reasoning_chunks_mean"), r.get("answer_chunks_mean")
    if _isnum(reasoning) and _isnum(answer) and reasoning > 0:
        return float((reasoning + answer + 1) / (reasoning + answer))
    return 1.0


def delivery_sentence(levels: pd.DataFrame, stream_interval: int | None) -> str:
    """Says in words whether each streamed event carried one engine step's tokens: tok/chunk
    equal to the stream interval (1 by default; the last event of a request may carry fewer),
    or above it, which means some hop merged engine steps into one event. `stream_interval`
    None: an external target, whose interval is unknown (1 is what real servers default to)."""
    if "tokens_per_chunk" not in levels or levels["tokens_per_chunk"].isna().all():
        return "delivery: no streamed tokens were measured."
    expected = stream_interval or 1
    tpc = levels.dropna(subset=["tokens_per_chunk"])
    above = [f"{level_label(r)} ({r['tokens_per_chunk']:.2f})"
             for _, r in tpc.iterrows()
             if r["tokens_per_chunk"] > expected * _think_end_allowance(r) * 1.005]
    what = (f"the stream interval ({expected})" if stream_interval is not None
            else "one token per event")
    if above:
        return (f"delivery: tok/chunk was above {what} at " + ", ".join(above) +
                ": events carried the tokens of several engine steps, so some hop merged them "
                "(TTFT and ITL then understate what a per-token client sees). The lab's own "
                "path never merges; a server may, e.g. with its own stream interval or behind "
                "a slow reader.")
    most = float(tpc["tokens_per_chunk"].max())
    if stream_interval is None:
        return (f"delivery: the target sent one event per token at every level "
                f"(tok/chunk at most {most:.2f}).") if most <= 1.005 else (
                f"delivery: tok/chunk at most {most:.2f}.")
    return (f"delivery: every event carried one engine step's tokens at every level "
            f"(tok/chunk at most {most:.2f}, stream interval {expected}).")


def reasoning_table(levels: pd.DataFrame) -> str | None:
    """Per level, the time to the first reasoning chunk (TTFR) and to the first answer chunk
    (TTFO) and the chunks of each kind per request (docs/metrics.md "Reasoning"); None when no
    level streamed reasoning."""
    if "ttfr_ms_p50" not in levels or levels["ttfr_ms_p50"].isna().all():
        return None
    header = ["Conc", "TTFR p50 ms", "TTFR p99 ms", "TTFO p50 ms", "TTFO p99 ms",
              "reasoning chunks/req", "answer chunks/req"]
    rows = [[_level_cell(r), fnum(r.get("ttfr_ms_p50"), 2), fnum(r.get("ttfr_ms_p99"), 2),
             fnum(r.get("ttfo_ms_p50"), 2), fnum(r.get("ttfo_ms_p99"), 2),
             fnum(r.get("reasoning_chunks_mean"), 1), fnum(r.get("answer_chunks_mean"), 1)]
            for _, r in levels.iterrows()]
    return md_table(header, rows)


def client_table(levels: pd.DataFrame) -> str:
    header = ["Conc", *headings(CLIENT_HEALTH)]
    rows = [[_level_cell(r), *[cell(r, c) for c in CLIENT_HEALTH]] for _, r in levels.iterrows()]
    return md_table(header, rows)


#: a server process that waited for a CPU this share of the time it was runnable (wait / (CPU
#: + wait)) at a level is named in the report: its timing there carries the machine's contention
SERVER_WAIT_SHARE = 0.10


def server_cpu_table(levels: pd.DataFrame) -> str | None:
    names = [c.split(":", 1)[1] for c in levels.columns if c.startswith("cpu_pct:")]
    if not names:
        return None
    waits = [n for n in names if f"cpu_wait_pct:{n}" in levels]
    per = (cat.SERVER_CPU_MS_PER_REQ.col(), cat.SERVER_CPU_US_PER_TOKEN.col())
    header = ["Conc", *[f"{n} CPU %" for n in names], *[f"{n} CPU wait %" for n in waits],
              *headings(per)]
    rows = []
    for _, r in levels.iterrows():
        rows.append([str(int(r["concurrency"])), *[fnum(r.get(f"cpu_pct:{n}"), 0) for n in names],
                     *[fnum(r.get(f"cpu_wait_pct:{n}"), 0) for n in waits],
                     *[cell(r, c) for c in per]])
    table = md_table(header, rows)
    header2 = ["Process", *[f"c={int(c)}" for c in levels["concurrency"]]]
    rows2 = []
    for n in names:
        rows2.append([f"{n} CPU-s / 1k req",
                      *[fnum(v, 2) for v in levels.get(f"cpu_s_per_1k:{n}", [])]])
    for n in names:
        rows2.append([f"{n} peak RSS MB",
                      *[fnum(v, 0) for v in levels.get(f"rss_peak_mb:{n}", [])]])
    return table + "\n\n" + md_table(header2, rows2)


def server_wait_shares(levels: pd.DataFrame) -> dict[str, list[tuple[str, float]]]:
    """Per sampled server process, (level, share) of every level: the share of the time it was
    runnable that it spent waiting for a CPU, wait / (CPU + wait) (launch.sampler's run-queue
    wait). Empty without the figure (no --server-pid, or a run from before the sampler read
    it)."""
    out: dict[str, list[tuple[str, float]]] = {}
    for col in levels.columns:
        if not col.startswith("cpu_wait_pct:"):
            continue
        name = col.split(":", 1)[1]
        if f"cpu_pct:{name}" not in levels:
            continue
        wait, cpu = levels[col], levels[f"cpu_pct:{name}"]
        share = wait / (wait + cpu).where(wait + cpu > 0)
        out[name] = [(_level_name(r), float(v))
                     for (_, r), v in zip(levels.iterrows(), share, strict=True) if v == v]
    return out


def waited_levels(shares: dict[str, list[tuple[str, float]]]) -> list[str]:
    """'NAME at c=8 (23%), c=32 (31%)' per server process of `shares` (`server_wait_shares`)
    that waited for a CPU for at least SERVER_WAIT_SHARE of its runnable time at some level."""
    out = []
    for name, pairs in shares.items():
        past = [f"{level} ({share:.0%})" for level, share in pairs if share >= SERVER_WAIT_SHARE]
        if past:
            out.append(f"{name} at " + ", ".join(past))
    return out


def server_wait_sentence(levels: pd.DataFrame) -> str | None:
    """Says which server processes waited for a CPU for at least SERVER_WAIT_SHARE of the time
    they were runnable, and at which levels; None without the figure."""
    shares = server_wait_shares(levels)
    if not shares:
        return None
    waited = waited_levels(shares)
    if not waited:
        most = max((v for pairs in shares.values() for _, v in pairs), default=0.0)
        return (f"server CPU wait: no server process waited for a CPU {SERVER_WAIT_SHARE:.0%} "
                f"of the time it was runnable (at most {most:.0%}).")
    return ("server CPU wait: " + "; ".join(waited) + " of the time runnable was spent waiting "
            "for a CPU: the machine's cores were shared (with the load client, or with the "
            "server's own busy-polling processes), so the server's timing at those levels "
            "carries that wait as well as its work.")


def build_report(*, title: str, setup: list[str], levels: pd.DataFrame, knee: Knee,
                 plots: list[tuple[str, str]], server_cpu_note: str | None = None,
                 fault_md: str | None = None, compare_md: str | None = None,
                 delivery: str | None = None, failed_lines: list[str] | None = None,
                 tokens_md: str | None = None, open_loop_md: str | None = None,
                 turns_md: str | None = None, slo_lines: list[str] | None = None) -> str:
    """The whole report.md. plots: [(caption, relative path)]; delivery: the tokens-per-event
    sentence; failed_lines: one sentence per level where every request failed; tokens_md:
    requested vs server-reported tokens; open_loop_md: the open-loop section of a --rate sweep
    (which has no knee: its levels are rates, not concurrency); turns_md: the per-turn table
    of a --turns run; slo_lines: goodput beside throughput and the SLO search's edge."""
    parts = [f"# {title}", ""]
    parts += [f"- {s}" for s in setup]
    parts += ["", "## Results", "", results_table(levels), ""]
    parts += [f"**{line}**" for line in failed_lines or []]
    if failed_lines:
        parts += [""]
    if open_loop_md:
        parts += ["## Open loop", "", open_loop_md, ""]
    else:
        parts += [f"**{knee.sentence()}**", ""]
    parts += [f"**{line}**" for line in slo_lines or []] + ([""] if slo_lines else [])
    if knee.steps:
        effs = ", ".join(
            f"e({s.to_conc}) = {'inf' if math.isinf(s.efficiency) else f'{s.efficiency:.2f}'}"
            for s in knee.steps)
        parts += [f"Marginal efficiency per step (threshold {knee.threshold:g}): {effs}.", ""]
    if delivery:
        parts += [delivery, ""]
    parts += [client_sentence(levels), ""]
    reasoning = reasoning_table(levels)
    if reasoning:
        parts += ["## Reasoning: first reasoning and first answer token", "", reasoning, ""]
    if turns_md:
        parts += ["## Per turn", "", turns_md, ""]
    if tokens_md:
        parts += ["## Prompt and completion tokens: requested vs server-reported", "", tokens_md,
                  ""]
    if compare_md:
        parts += ["## Comparison", "", compare_md, ""]
    if fault_md:
        parts += ["## Faults", "", fault_md, ""]
    parts += ["## Server CPU", ""]
    table = server_cpu_table(levels)
    if table:
        parts += [table, ""]
        wait = server_wait_sentence(levels)
        if wait:
            parts += [wait, ""]
    else:
        parts += [server_cpu_note or "Per-process server CPU is absent for this run.", ""]
    parts += ["## Client health", "", client_table(levels), ""]
    if plots:
        parts += ["## Plots", ""]
        for caption, rel in plots:
            parts += [f"### {caption}", "", f"![{caption}]({rel})", ""]
    return "\n".join(parts).rstrip() + "\n"
