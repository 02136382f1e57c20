"""What `lab nagle` leaves in its run directory: the statistics table, nagle.json (statistics and
the verdict as data), report.md, plots and requests.parquet; and `--reanalyse` of such a run.

Statistics: lab.nagle.stats; the verdict: lab.nagle.verdict (data) and
lab.nagle.words (its sentences); plots: lab.nagle.plots.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from lab.load.workload import endpoint_path
from lab.nagle.arms import SINGLE, Arm
from lab.nagle.kernel_facts import KernelFacts, kernel_facts
from lab.nagle.settings import NagleSettings
from lab.nagle.stats import MIN_SAMPLES, ArmResult, arm_results
from lab.nagle.verdict import Verdict, external_verdict, launched_verdict
from lab.shared.settings import SocketSettings

if TYPE_CHECKING:
    import pandas as pd


def samples_of(requests: pd.DataFrame) -> dict[str, dict[int, list[float]]]:
    """arm -> level -> TTFT ms of the successful, non-warm-up requests (in arm order), from the
    requests with the derived figures (`requests_frame`)."""
    import pandas as pd

    out: dict[str, dict[int, list[float]]] = {}
    if requests.empty:
        return out
    for arm, level, ok, warmup, ttft in zip(requests["arm"], requests["level"], requests["ok"],
                                            requests["warmup"], requests["ttft_ms"], strict=True):
        lv = out.setdefault(arm, {}).setdefault(int(level), [])
        if ok and not warmup and not pd.isna(ttft):
            lv.append(float(ttft))
    return out


def _f(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def stats_table(arms: dict[str, ArmResult], errors: dict[tuple[str, int], int]) -> str:
    """Markdown table: one row per arm and level."""
    head = (
        "| arm | c | n | failed | TTFT min | p50 | p90 | p99 | max | in stall cluster "
        "| cluster median | shape |"
    )
    rows = [head, "|" + "---|" * 12]
    for name, res in arms.items():
        for conc, s in sorted(res.levels.items()):
            share = "-" if s.n == 0 else f"{100 * s.cluster_share:.0f}%"
            rows.append(
                f"| {name} | {conc} | {s.n} | {errors.get((name, conc), 0)} | {_f(s.min_ms)} "
                f"| {_f(s.p50_ms)} | {_f(s.p90_ms)} | {_f(s.p99_ms)} | {_f(s.max_ms)} "
                f"| {share} | {_f(s.cluster_median_ms)} | {s.shape} |"
            )
    return "\n".join(rows)


def analyse(
    requests: pd.DataFrame,
    arms: list[Arm],
    *,
    threshold_ms: float,
    many: int,
    external: bool,
    facts: KernelFacts | None = None,
) -> tuple[dict[str, ArmResult], Verdict, dict[str, dict[int, list[float]]]]:
    samples = samples_of(requests)
    labels = {a.name: a.label for a in arms}
    ordered = {a.name: samples.get(a.name, {c: [] for c in a.levels}) for a in arms}
    independent = [a.name for a in arms if not a.stream]
    results = arm_results(ordered, labels, threshold_ms=threshold_ms, independent=independent)
    if external:
        gaps = [a.name for a in arms if a.gap_ms > 0]
        verdict = external_verdict(
            results, reused="reused", fresh="fresh-connection", many_arm="reused",
            nonstream="non-streaming", gap_arms=gaps, single=SINGLE, many=many, facts=facts,
        )
    else:
        verdict = launched_verdict(results, single=SINGLE, many=many, facts=facts)
    return results, verdict, ordered


def write_config(out: Path, settings: dict[str, Any]) -> None:
    """config.json through launch's writer: environment, versions, machine + a "nagle" section."""
    from launch.config import write_config as launch_write_config

    launch_write_config(out, extra={"nagle": settings})


def write_outputs(
    out: Path,
    records: list[dict],
    arms: list[Arm],
    opts: NagleSettings,
    *,
    external: bool,
    loadavg: list[float] | None = None,
) -> tuple[dict[str, ArmResult], Verdict, str]:
    """requests.parquet (the records' stamps and counts), nagle.json, plots/*.png, report.md;
    returns the printed table. The TTFTs are derived from the stamps (`requests_frame`)."""
    from lab.analysis.request_times import requests_frame, stored_columns
    from lab.nagle.plots import ttft_cdf, ttft_histograms

    frame = requests_frame(records)
    facts = kernel_facts()
    results, verdict, samples = analyse(
        frame, arms, threshold_ms=opts.threshold_ms, many=opts.many, external=external,
        facts=facts,
    )
    errors: dict[tuple[str, int], int] = {}
    for r in records:
        if not r.get("ok"):
            key = (r["arm"], int(r["level"]))
            errors[key] = errors.get(key, 0) + 1
    stored_columns(frame).to_parquet(out / "requests.parquet", index=False)
    tokens_md = _tokens_section(frame, opts.endpoint)
    floor = next(
        (s.cluster_floor_ms for a in arms if a.stream
         and (s := results[a.name].at(SINGLE)) is not None and s.cluster_floor_ms is not None),
        None,
    )
    plots = out / "plots"
    cdf = ttft_cdf(samples, plots / "ttft_cdf.png", floor_ms=floor,
                   title="TTFT CDF per arm (solid: concurrency 1)")
    hist = ttft_histograms(samples, plots / "ttft_hist.png")
    table = stats_table(results, errors)
    doc: dict[str, Any] = {
        "mode": "external" if external else "launched",
        "target": opts.target,
        "model": opts.model,
        "threshold_ms": opts.threshold_ms,
        "min_samples": MIN_SAMPLES,
        "requests_per_level": opts.requests,
        "options": opts.model_dump(mode="json"),
        "levels": [SINGLE, opts.many],
        "arms": [a.to_dict() for a in arms],
        "stats": {n: r.to_dict() for n, r in results.items()},
        "errors": {f"{a}@{c}": k for (a, c), k in errors.items()},
        "verdict": verdict.to_dict(),
        "kernel": facts.to_dict(),
    }
    doc["loadavg_end"] = list(loadavg) if loadavg else list(os.getloadavg())
    load = " / ".join(f"{v:.2f}" for v in doc["loadavg_end"])
    (out / "nagle.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    where = f"target {opts.target} (model {opts.model})" if external else (
        f"the launched aggregated stack (speedup {opts.speedup:g}), one stack per arm"
    )
    ttft_note = (
        "\nNon-streaming arms: TTFT is the full response time.\n"
        if any(not a.stream for a in arms) else ""
    )
    prompts = (f"{opts.prompt_kind} prompts on {endpoint_path(opts.workload())}"
               + (f", tokenizer {opts.tokenizer}" if opts.tokenizer else "")
               + ("" if opts.include_usage else ", no stream usage (the server refused it)"))
    arm_lines = "\n".join(f"- **{a.name}**: {a.label}" for a in arms)
    detail = "\n".join(f"- {line}" for line in verdict.lines)
    report = f"""# Nagle / delayed-ACK probe

On {where}; {opts.requests} requests per level (ISL {opts.isl}, OSL {opts.osl}, seed {opts.seed},
{prompts}),
concurrency {SINGLE} on a persistent connection and concurrency {opts.many}.
Stall cluster: TTFT at least {opts.threshold_ms:g} ms above the fastest decile (per concurrency
level, of the fastest arm at that level). At concurrency {opts.many} that share includes queueing:
compare it with the control's, not with zero. Kernel: {facts.sentence()}.
Machine: {os.cpu_count()} CPUs, load average {load} at the end of the run (a shared machine
stretches every number).

## Verdict

**{verdict.text}**

{detail}

## Arms

{arm_lines}

## TTFT (ms)

{table}
{ttft_note}
{tokens_md}
![TTFT CDF]({cdf.relative_to(out)})

![TTFT histograms]({hist.relative_to(out)})
"""
    (out / "report.md").write_text(report)
    return results, verdict, table


# --- the command ----------------------------------------------------------------------------------


_CLIENT_COLUMNS = frozenset({"level", "ok", "warmup", "sent_ns", "end_ns", "done_ns",
                             "chunk_times_ns", "isl_requested", "input_tokens_source"})


def _tokens_section(frame: Any, endpoint: str) -> str:
    """Requested vs server-reported tokens per concurrency (all arms together), as in a sweep's
    report."""
    from lab.analysis.checks import token_check
    from lab.analysis.metrics import by_concurrency, summarize_run
    from lab.report.tokens import tokens_markdown

    # records of the load client (reanalysed runs of older versions may lack these columns)
    if frame.empty or not set(frame.columns) >= _CLIENT_COLUMNS:
        return ""
    frame = frame.assign(concurrency=frame["level"])
    check = token_check(frame, by_concurrency(summarize_run(frame)), endpoint)
    if check is None:
        return ""
    return ("\n## Prompt and completion tokens: requested vs server-reported (all arms)\n\n"
            + tokens_markdown(check) + "\n")



def reanalyse(run: Path, threshold_ms: float | None = None) -> tuple[str, Verdict]:
    """Recompute the outputs of a probe's run directory from requests.parquet and nagle.json."""
    import pandas as pd

    try:
        doc = json.loads((run / "nagle.json").read_text())
        df = pd.read_parquet(run / "requests.parquet")
    except (OSError, ValueError) as exc:
        raise click.BadParameter(f"{run}: not a nagle run directory ({exc})",
                                 param_hint="--reanalyse") from exc
    stored = doc.get("options") or {
        "requests": doc["requests_per_level"], "many": doc["levels"][-1],
        "threshold_ms": doc["threshold_ms"], "model": doc["model"], "target": doc["target"],
    }
    known = {k: v for k, v in stored.items() if k in NagleSettings.model_fields}
    if threshold_ms is not None:
        known["threshold_ms"] = threshold_ms
    opts = NagleSettings.model_validate({**known, "reanalyse_dir": run})
    arms = []
    for a in doc["arms"]:
        sockets = SocketSettings(**a["sockets"]) if a.get("sockets") else None
        arms.append(Arm(**{**a, "sockets": sockets, "levels": tuple(a["levels"])}))
    records = [
        {**r, "chunk_times_ns": list(r["chunk_times_ns"])} if "chunk_times_ns" in r else r
        for r in df.to_dict("records")
    ]
    _, verdict, table = write_outputs(run, records, arms, opts, external=doc["mode"] == "external",
                                      loadavg=doc.get("loadavg_end"))
    return table, verdict
