"""The metric definitions (docs/metrics.md "Definitions"), in one place.

| metric | definition |
|---|---|
| TTFT | first content chunk - request sent |
| TTST | second content chunk - first content chunk |
| request latency | last content chunk - request sent |
| ITL (per request) | (latency - TTFT) / (output tokens - 1) |
| TTFR, TTFO | first reasoning / first answer chunk - request sent (TTFO = TTFT without reasoning) |
| inter-chunk gaps | every gap between consecutive content chunks, pooled over requests |
| output tokens | the server's usage when present, else counted chunks (output_tokens_source) |
| request throughput | successful requests / measured duration |
| output token throughput | total output tokens (successful requests) / measured duration |
| measured duration | last response of the level - first request of the level (warm-up excluded) |
| error rate | failed / (succeeded + failed) |
| goodput | requests meeting every given SLO / measured duration |
| SLO share | requests meeting every given SLO / measured requests (failures count as missing) |

The client stores ns stamps; analysis derives every ms figure once. The per-request values
(send_delay_ms, ttft_ms, ttst_ms, latency_ms, itl_ms) are derived from the ns columns by
`lab.analysis.request_times.with_request_times`; the functions here read frames that went
through it (`rundir.read_requests`, `request_times.requests_frame`), so a run is analysed
from requests.parquet alone. The levels.csv columns they fill, with their units and statistics,
are the catalogue's (`lab.analysis.catalogue`).

Percentiles are exact: numpy's linear interpolation over all values.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pandas as pd

from lab.analysis import catalogue as cat
from lab.analysis.levels import level_key, level_keys
from lab.analysis.request_times import NS_PER_MS
from lab.analysis.slo_share import SLOs as SLOs
from lab.analysis.slo_share import slo_figures
from lab.analysis.stats import cancelled_mask, describe, measured
from lab.open_loop.figures import open_loop_figures


def chunk_gaps_ms(df: pd.DataFrame) -> np.ndarray:
    """Every gap between consecutive content chunks, pooled over the rows' requests (ms)."""
    parts = [np.diff(np.asarray(t, dtype=np.int64)) for t in df["chunk_times_ns"]
             if t is not None and len(t) > 1]
    if not parts:
        return np.empty(0)
    return np.concatenate(parts) / NS_PER_MS


def window_ns(df: pd.DataFrame) -> tuple[int | None, int | None]:
    """Measured window: first request sent -> last response (last content chunk, or stream end
    for a request without content), over non-warm-up rows."""
    m = measured(df)
    if m.empty:
        return None, None
    start = int(m["sent_ns"].min())
    last = m["end_ns"].astype("float64").fillna(m["done_ns"].astype("float64"))
    end = int(last.max()) if last.notna().any() else start
    return start, end


def error_counts(df: pd.DataFrame) -> dict[str, int]:
    failed = df[~df["ok"].astype(bool) & ~cancelled_mask(df)]
    return dict(Counter(str(k) for k in failed["error_kind"]).most_common())


def format_errors(counts: dict[str, int]) -> str:
    """'0', or '3 (http_503: 2, disconnect: 1)'."""
    total = sum(counts.values())
    if not total:
        return "0"
    return f"{total} (" + ", ".join(f"{k}: {n}" for k, n in counts.items()) + ")"


def process_figures(procs: pd.DataFrame | None, start: int | None, end: int | None,
                    duration_s: float, ok: int, out_tokens: int = 0) -> dict[str, Any]:
    """Each server process's CPU % and CPU wait % (run-queue delay, launch.sampler) over the
    window and peak RSS (MB), and the server's CPU per request (ms) and per output token (us),
    summed over processes.

    A sample's cpu_pct covers the interval since that pid's previous sample (launch.sampler), so
    each sample counts by how much of its interval lies in the window: a sample taken just after
    the level, or one whose interval straddles its start, counts for its share only. (An
    unweighted mean of the samples in (start, end + one interval] moved a 1-2 s level's figure by
    up to a third with the phase of the 0.5 s sampling.) A pid's first sample covers one of its
    usual intervals (a pid sampled once: the other pids' usual interval)."""
    if procs is None or procs.empty or start is None or end is None:
        return {}
    rows = procs.sort_values("t_ns", kind="stable")
    key = [rows["name"], rows["pid"]]
    since = rows.groupby(key)["t_ns"].shift()
    steps = rows.groupby(key)["t_ns"].transform(lambda t: t.diff().median())
    since = since.fillna(rows["t_ns"] - steps.fillna(steps.median()))
    overlap = (np.minimum(rows["t_ns"], end) - np.maximum(since, start)).clip(lower=0)
    win = rows.assign(overlap=overlap)[overlap > 0]
    if win.empty:
        return {}
    out: dict[str, Any] = {}
    total_cpu_s = 0.0
    waits = "cpu_wait_pct" in win  # run directories from before the sampler read it have none
    for name, g in win.groupby("name", sort=True):
        cpu = float(np.average(g["cpu_pct"], weights=g["overlap"]))
        out[f"cpu_pct:{name}"] = cpu
        if waits and g["cpu_wait_pct"].notna().any():
            w = g[g["cpu_wait_pct"].notna()]
            out[f"cpu_wait_pct:{name}"] = float(np.average(w["cpu_wait_pct"],
                                                           weights=w["overlap"]))
        out[f"rss_peak_mb:{name}"] = float(g["rss_bytes"].max()) / 1e6
        cpu_s = cpu / 100.0 * duration_s
        total_cpu_s += cpu_s
        out[f"cpu_s_per_1k:{name}"] = 1000.0 * cpu_s / ok if ok else None
    out[cat.SERVER_CPU_PCT.name] = sum(v for k, v in out.items() if k.startswith("cpu_pct:"))
    wait_cols = [v for k, v in out.items() if k.startswith("cpu_wait_pct:")]
    if wait_cols:
        out[cat.SERVER_CPU_WAIT_PCT.name] = sum(wait_cols)
    out[cat.SERVER_CPU_MS_PER_REQ.name] = 1000.0 * total_cpu_s / ok if ok else None
    out[cat.SERVER_CPU_US_PER_TOKEN.name] = (1e6 * total_cpu_s / out_tokens if out_tokens
                                             else None)
    return out


#: the reasoning stream's metrics (lab.analysis.catalogue)
REASONING = (cat.TTFR, cat.TTFO, cat.REASONING_CHUNKS, cat.ANSWER_CHUNKS)


def reasoning_figures(ok_rows: pd.DataFrame) -> dict[str, Any]:
    """A level's reasoning-stream figures (docs/metrics.md "Reasoning"): TTFR and TTFO p50/p99
    and the mean reasoning-only and answer chunks per request; TTFR is None and the reasoning
    chunks 0 for a level without reasoning. The columns are REASONING_LEVEL_COLUMNS."""
    n = len(ok_rows)
    reasoning = (ok_rows["reasoning_chunks"].fillna(0).astype("float64")
                 if "reasoning_chunks" in ok_rows else pd.Series(0.0, index=ok_rows.index))
    row: dict[str, Any] = {}
    row.update(cat.TTFR.values(describe(ok_rows["ttfr_ms"])))
    row.update(cat.TTFO.values(describe(ok_rows["ttfo_ms"])))
    row[cat.REASONING_CHUNKS.name] = float(reasoning.mean()) if n else None
    row[cat.ANSWER_CHUNKS.name] = (float((ok_rows["chunks"].fillna(0) - reasoning).mean())
                                   if n else None)
    return row


#: The levels.csv columns of `reasoning_figures`, in order.
REASONING_LEVEL_COLUMNS = tuple(c.name for m in REASONING for c in m.columns())


def level_summary(df: pd.DataFrame, *, procs: pd.DataFrame | None = None,
                  client: dict | None = None, slos: SLOs | None = None) -> dict[str, Any]:
    """One row of levels.csv from the requests of one level (one concurrency, one repeat), with
    the derived per-request figures (`with_request_times`)."""
    m = measured(df)
    ok_rows = m[m["ok"].astype(bool)]
    n_ok = len(ok_rows)
    n_cancelled = int(cancelled_mask(m).sum())
    n_failed = len(m) - n_ok - n_cancelled
    start, end = window_ns(df)
    duration_s = (end - start) / 1e9 if start is not None and end is not None else 0.0
    out_tokens = int(ok_rows["output_tokens"].fillna(0).sum())
    chunks = int(ok_rows["chunks"].fillna(0).sum())
    errors = error_counts(m)
    row: dict[str, Any] = {
        "concurrency": int(df["concurrency"].iloc[0]) if len(df) else None,
        "repeat": int(df["repeat"].iloc[0]) if "repeat" in df and len(df) else 0,
        "requests": len(m),
        "ok": n_ok,
        "failed": n_failed,
        "cancelled": n_cancelled,
        "warmup": int(len(df) - len(m)),
        cat.ERROR_RATE.name: n_failed / len(m) if len(m) else None,
        "errors": format_errors(errors),
        cat.DURATION.name: duration_s,
        cat.REQ_S.name: n_ok / duration_s if duration_s > 0 else None,
        cat.OUT_TOK_S.name: out_tokens / duration_s if duration_s > 0 else None,
        "output_tokens": out_tokens,
        "output_tokens_mean": float(ok_rows["output_tokens"].mean()) if n_ok else None,
        "input_tokens_mean": float(ok_rows["input_tokens"].mean()) if n_ok else None,
        "cached_tokens_mean": (float(ok_rows["cached_tokens"].mean())
                               if n_ok and ok_rows["cached_tokens"].notna().any() else None),
        "output_tokens_source": (ok_rows["output_tokens_source"].mode().iloc[0] if n_ok else None),
        **requested_vs_reported(ok_rows),
        cat.TOKENS_PER_CHUNK.name: out_tokens / chunks if chunks else None,
        "window_start_ns": start,
        "window_end_ns": end,
    }
    for figure in (cat.TTFT, cat.TTST, cat.LATENCY, cat.ITL):  # per-request columns of that name
        row.update(figure.values(describe(ok_rows[figure.name])))
    row.update(cat.GAP.values(describe(chunk_gaps_ms(ok_rows))))
    row.update(cat.SEND_DELAY.values(describe(m["send_delay_ms"])))
    row.update(reasoning_figures(ok_rows))
    if slos is not None and slos.given():
        row.update(slo_figures(m, ok_rows, slos, duration_s))
    client = client or {}
    if "rate" in df and df["rate"].notna().any():
        row.update(open_loop_figures(df))
    # the client's health figures, as client.json names them
    for figure, key in ((cat.CLIENT_PROCS, "procs"), (cat.CLIENT_CPU_PCT, "cpu_pct"),
                        (cat.CLIENT_CPU_PCT_MAX_PROC, "cpu_pct_max_proc"),
                        (cat.CLIENT_CPU_MS_PER_REQ, "cpu_ms_per_request"),
                        (cat.LOOP_LAG_P99, "loop_lag_p99_ms"),
                        (cat.LOOP_LAG_MAX, "loop_lag_max_ms")):
        row[figure.name] = client.get(key)
    row.update(process_figures(procs, start, end, duration_s, n_ok, out_tokens))
    row.update(whole_machine_cpu(client.get("cpu_s"), df,
                                 row.get(cat.SERVER_CPU_US_PER_TOKEN.name)))
    return row


def whole_machine_cpu(client_cpu_s: float | None, df: pd.DataFrame,
                      server_us_per_token: float | None) -> dict[str, float | None]:
    """The client's CPU per output token (us) and the whole machine's (server + client).

    The client's CPU seconds cover every request of the level, warm-up included, so they are
    divided by the output tokens of all its successful requests (the server's figure is over
    the measured window's tokens); both are rates per token, so they add up."""
    ok_all = df[df["ok"].astype(bool)] if len(df) else df
    tokens = int(ok_all["output_tokens"].fillna(0).sum()) if len(ok_all) else 0
    client = 1e6 * client_cpu_s / tokens if client_cpu_s is not None and tokens else None
    total = (client + server_us_per_token
             if client is not None and server_us_per_token is not None else None)
    return {cat.CLIENT_CPU_US_PER_TOKEN.name: client, cat.TOTAL_CPU_US_PER_TOKEN.name: total}


def requested_vs_reported(ok_rows: pd.DataFrame) -> dict[str, float | None]:
    """Mean prompt/completion tokens the workload asked for, and the server's usage figures
    (None when the server reported none: then the client's fallback is not a server figure)."""
    def mean(col: str, rows: pd.DataFrame) -> float | None:
        v = rows[col].astype("float64") if col in rows else pd.Series(dtype="float64")
        return float(v.mean()) if v.notna().any() else None

    src_in = ok_rows.get("input_tokens_source")
    src_out = ok_rows.get("output_tokens_source")
    with_prompt = ok_rows[src_in == "usage"] if src_in is not None else ok_rows.iloc[:0]
    with_completion = ok_rows[src_out == "usage"] if src_out is not None else ok_rows.iloc[:0]
    return {
        "isl_requested_mean": mean("isl_requested", ok_rows),
        "prompt_tokens_reported_mean": mean("input_tokens", with_prompt),
        "osl_requested_mean": mean("osl_requested", ok_rows),
        "completion_tokens_reported_mean": mean("output_tokens", with_completion),
    }


def _numeric_or_none(values: pd.Series) -> bool:
    return bool(values.map(lambda v: v is None or isinstance(v, int | float)).all())


def summarize_run(requests: pd.DataFrame, *, procs: pd.DataFrame | None = None,
                  clients: dict[str, dict] | None = None, slos: SLOs | None = None) -> pd.DataFrame:
    """levels.csv: one row per (concurrency, repeat), sorted; `clients` keyed by level_key()."""
    if "repeat" not in requests:
        requests = requests.assign(repeat=0)
    rows = []
    keys = level_keys(requests)
    for key, g in requests.groupby(keys, sort=True, dropna=False):
        values = dict(zip(keys, key, strict=True))
        conc, rep = values["concurrency"], values["repeat"]
        client = (clients or {}).get(level_key(int(conc), int(rep), values.get("rate")))
        rows.append(level_summary(g, procs=procs, client=client, slos=slos))
    out = pd.DataFrame(rows)
    # a level where every request failed has None for every latency figure: keep such columns
    # numeric (NaN), so the analysis reads them like any other level's
    for col in [c for c in out.columns if pd.api.types.is_object_dtype(out[c].dtype)]:
        if _numeric_or_none(out[col]):
            out[col] = out[col].astype("float64")
    return out


def by_concurrency(levels: pd.DataFrame) -> pd.DataFrame:
    """One row per concurrency: the mean over repeats, plus min/max of req/s and latency avg
    (the spread shown when a sweep repeats levels)."""
    if levels.empty:
        return levels
    keys = [k for k in level_keys(levels) if k != "repeat"]
    numeric = levels.select_dtypes("number").columns.difference([*keys, "repeat"])
    agg = levels.groupby(keys, sort=True, dropna=False)
    out = agg[list(numeric)].mean()
    out["repeats"] = agg.size()
    for col in (cat.REQ_S.name, cat.LATENCY.col("avg").name):
        if col in levels:
            out[f"{col}_min"] = agg[col].min()
            out[f"{col}_max"] = agg[col].max()
    out["errors"] = agg["errors"].agg(_merge_errors)
    for col in ("failed", "ok", "requests", "cancelled"):
        if col in levels:
            out[col] = agg[col].sum()
    return out.reset_index()


def _merge_errors(values: pd.Series) -> str:
    total: Counter[str] = Counter()
    for text in values:
        if not text or text == "0" or "(" not in text:
            continue
        inner = text[text.index("(") + 1 : text.rindex(")")]
        for part in inner.split(", "):
            kind, _, n = part.rpartition(": ")
            total[kind] += int(n)
    return format_errors(dict(total.most_common()))
