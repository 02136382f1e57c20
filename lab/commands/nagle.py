"""`lab nagle`: the idle-connection Nagle / delayed-ACK probe.

On the launched stack, each arm is one SocketSettings (one aggregated stack per arm, torn down
between arms), driven with the same requests at concurrency 1 on a persistent connection and at
concurrency `--many`. With `--target URL --model NAME` nothing is launched: the arms become
traffic shapes against that server (reused vs fresh connections, idle gaps, continuous traffic,
streaming vs not). Statistics and the verdict: lab.analysis.nagle; plots: lab.report.nagle_plots.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import click

from lab.analysis.nagle import (
    DEFAULT_THRESHOLD_MS,
    MIN_SAMPLES,
    ArmResult,
    KernelFacts,
    Verdict,
    arm_results,
    external_verdict,
    kernel_facts,
    launched_verdict,
)
from lab.commands.target import prompt_form_options, target_or_exit, workload_from_options
from lab.load.workload import LAB_PROMPT_KIND, RequestSet, WorkloadSpec, endpoint_path
from lab.serve.settings import DEFAULT_MODEL, SocketSettings
from launch.topology import DEFAULT_SPEEDUP

DEFAULT_REQUESTS = 200
DEFAULT_MANY = 32
DEFAULT_ARMS = ("control", "suspect")
DEFAULT_EXTERNAL_GAP_MS = 100.0
SINGLE = 1


@dataclass(frozen=True)
class Arm:
    """One arm: what differs (socket settings on the launched stack, traffic shape otherwise)."""

    name: str
    label: str
    sockets: SocketSettings | None = None  # launched stack only
    fresh_connection: bool = False
    gap_ms: float = 0.0
    stream: bool = True
    levels: tuple[int, ...] = (SINGLE, DEFAULT_MANY)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["sockets"] = None if self.sockets is None else asdict(self.sockets)
        return d


_SUSPECT = SocketSettings(client_nodelay=False, split_writes=True)

# The launched stack's arms: each differs from the defaults in the settings its label names.
LAUNCHED_ARMS: dict[str, Arm] = {
    a.name: a
    for a in (
        Arm("control", "NODELAY on both ends and coalesced writes", SocketSettings()),
        Arm("suspect", "client NODELAY off and split writes", _SUSPECT),
        Arm("server-nodelay-off", "server NODELAY off", SocketSettings(server_nodelay=False)),
        Arm(
            "both-off",
            "NODELAY off on both ends and split writes",
            SocketSettings(client_nodelay=False, server_nodelay=False, split_writes=True),
        ),
        Arm(
            "coalesced-nodelay-off",
            "NODELAY off on both ends with coalesced writes",
            SocketSettings(client_nodelay=False, server_nodelay=False, split_writes=False),
        ),
        Arm(
            "http-nodelay-off",
            "NODELAY off on the frontend's HTTP connections",
            SocketSettings(http_nodelay=False),
        ),
        Arm(
            "fresh-connection",
            "client NODELAY off and split writes, one HTTP connection per request",
            _SUSPECT,
            fresh_connection=True,
        ),
    )
}
EXTERNAL_ARMS = ("reused", "fresh-connection", "gap", "non-streaming")


def _csv(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def parse_gaps(text: str) -> list[float]:
    try:
        gaps = [float(p) for p in _csv(text)]
    except ValueError:
        raise click.BadParameter(
            f"{text!r}: expected comma-separated numbers", param_hint="--gap-ms"
        ) from None
    if not gaps or any(g < 0 for g in gaps):
        raise click.BadParameter(f"{text!r}: expected numbers >= 0", param_hint="--gap-ms")
    return gaps


def _fmt_gap(g: float) -> str:
    return f"{g:g}ms"


def launched_arms(names: list[str], gaps: list[float], many: int) -> list[Arm]:
    """The launched-stack arms selected by --arms, plus one suspect arm per non-zero --gap-ms
    (those run at concurrency 1 only: an idle gap means nothing under continuous traffic)."""
    if names == ["all"]:
        names = list(LAUNCHED_ARMS)
    unknown = [n for n in names if n not in LAUNCHED_ARMS]
    if unknown:
        raise click.BadParameter(
            f"unknown arm {unknown[0]!r} (known: {', '.join(LAUNCHED_ARMS)}, or all)",
            param_hint="--arms",
        )
    arms = [replace(LAUNCHED_ARMS[n], levels=(SINGLE, many)) for n in dict.fromkeys(names)]
    for g in gaps:
        if g > 0:
            arms.append(
                Arm(
                    f"suspect-gap-{_fmt_gap(g)}",
                    f"client NODELAY off and split writes, {g:g} ms idle between requests",
                    _SUSPECT,
                    gap_ms=g,
                    levels=(SINGLE,),
                )
            )
    return arms


def external_arms(names: list[str], gaps: list[float], many: int) -> list[Arm]:
    """Traffic shapes against a stack the lab did not launch."""
    if names == ["all"]:
        names = list(EXTERNAL_ARMS)
    unknown = [n for n in names if n not in EXTERNAL_ARMS]
    if unknown:
        raise click.BadParameter(
            f"unknown arm {unknown[0]!r} with --target (known: {', '.join(EXTERNAL_ARMS)}, "
            "or all; socket-setting arms need the launched stack)",
            param_hint="--arms",
        )
    arms: list[Arm] = [
        Arm("reused", "one reused connection, back to back", levels=(SINGLE, many))
    ]
    if "fresh-connection" in names:
        arms.append(
            Arm("fresh-connection", "a fresh connection per request", fresh_connection=True,
                levels=(SINGLE, many))
        )
    if "gap" in names:
        for g in gaps:
            if g > 0:
                arms.append(
                    Arm(f"gap-{_fmt_gap(g)}", f"{g:g} ms idle between requests on one connection",
                        gap_ms=g, levels=(SINGLE,))
                )
    if "non-streaming" in names:
        arms.append(
            Arm("non-streaming", "non-streaming on one reused connection (TTFT = full response)",
                stream=False, levels=(SINGLE,))
        )
    return arms


# --- running -------------------------------------------------------------------------------------


@dataclass
class ProbeOptions:
    requests: int = DEFAULT_REQUESTS
    many: int = DEFAULT_MANY
    threshold_ms: float = DEFAULT_THRESHOLD_MS
    speedup: float = DEFAULT_SPEEDUP
    isl: int = WorkloadSpec.isl
    osl: int = WorkloadSpec.osl
    seed: int = 0
    warmup: int = 0
    timeout_s: float = 60.0
    model: str = DEFAULT_MODEL
    target: str | None = None
    topology: str | None = None  # a TOML topology (e.g. with hosts); each arm changes its sockets
    prompt_kind: str = LAB_PROMPT_KIND
    endpoint: str = "completions"
    tokenizer: str | None = None  # prompts exact in it; the launched frontend tokenizes with it
    include_usage: bool = True  # False: the target refused stream_options.include_usage

    def workload(self, stream: bool = True) -> WorkloadSpec:
        return WorkloadSpec(isl=self.isl, osl=self.osl, seed=self.seed, stream=stream,
                            prompt_kind=self.prompt_kind, endpoint=self.endpoint,
                            tokenizer=self.tokenizer, include_usage=self.include_usage)


def _log(msg: str) -> None:
    click.echo(msg, err=True)


def _bodies(opts: ProbeOptions, model: str, arm: Arm, conc: int,
            level_seed: int) -> RequestSet:
    return RequestSet(opts.workload(stream=arm.stream), model, level_seed, opts.requests)


async def _run_arm_levels(url: str, model: str, arm: Arm, opts: ProbeOptions,
                          seed_of: Callable[[Arm, int], int]) -> list[dict]:
    from lab.load.client import ClientOptions, run_level

    records: list[dict] = []
    for conc in arm.levels:
        bodies = _bodies(opts, model, arm, conc, seed_of(arm, conc))
        copts = ClientOptions(
            fresh_connection=arm.fresh_connection,
            gap_ms=arm.gap_ms,
            timeout_s=opts.timeout_s,
            request_id_prefix=f"nagle-{arm.name}-c{conc}-",
        )
        t0 = time.monotonic()
        res = await run_level(url, bodies, conc, warmup=opts.warmup, options=copts)
        for r in res.records:
            r["arm"] = arm.name
            r["level"] = conc
        errors = sum(1 for r in res.records if not r.get("ok"))
        _log(
            f"  {arm.name} c={conc}: {len(res.records)} requests, {errors} failed, "
            f"{time.monotonic() - t0:.1f} s"
        )
        if errors and all(not r.get("ok") for r in res.records):
            first = res.records[0]
            raise click.ClickException(
                f"arm {arm.name}: every request failed at concurrency {conc}: "
                f"{first.get('error_kind')}: {first.get('error_message')}"
            )
        records.extend(res.records)
    return records


async def run_launched(arms: list[Arm], opts: ProbeOptions, out: Path) -> list[dict]:
    """One aggregated stack per arm, torn down before the next; the same requests in every arm."""
    from launch.stack import Stack
    from launch.topology import TopologySpec

    base = TopologySpec.from_toml(Path(opts.topology)) if opts.topology else None
    records: list[dict] = []
    for arm in arms:
        assert arm.sockets is not None
        if base is not None:
            spec = replace(base, sockets=arm.sockets, name=f"nagle-{arm.name}",
                           tokenizer=opts.tokenizer or base.tokenizer)
        else:
            spec = TopologySpec.aggregated(
                engines=1, speedup=opts.speedup, sockets=arm.sockets, model=opts.model,
                name=f"nagle-{arm.name}", tokenizer=opts.tokenizer,
            )
        _log(f"arm {arm.name}: {arm.label} -- launching the stack")
        async with Stack(spec, out / "arms" / arm.name) as stack:
            records.extend(
                await _run_arm_levels(stack.frontend_url, stack.model, arm, opts,
                                      lambda _a, conc: conc)
            )
    return records


async def run_external(arms: list[Arm], opts: ProbeOptions) -> list[dict]:
    """Traffic shapes against --target. Each arm gets its own prompts (a distinct level seed),
    so no arm is served from a prefix cache another arm warmed."""
    assert opts.target is not None
    records: list[dict] = []
    seeds = {a.name: 1000 * (i + 1) for i, a in enumerate(arms)}
    for arm in arms:
        _log(f"arm {arm.name}: {arm.label}")
        records.extend(
            await _run_arm_levels(opts.target, opts.model, arm, opts,
                                  lambda a, conc: seeds[a.name] + conc)
        )
    return records


# --- analysis and outputs ---------------------------------------------------------------------


def samples_from_records(records: list[dict]) -> dict[str, dict[int, list[float]]]:
    """arm -> level -> TTFT ms of the successful, non-warm-up requests (in arm order)."""
    out: dict[str, dict[int, list[float]]] = {}
    for r in records:
        lv = out.setdefault(r["arm"], {}).setdefault(int(r["level"]), [])
        if r.get("ok") and not r.get("warmup") and r.get("ttft_ms") is not None:
            lv.append(float(r["ttft_ms"]))
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
    records: list[dict],
    arms: list[Arm],
    *,
    threshold_ms: float,
    many: int,
    external: bool,
    facts: KernelFacts | None = None,
) -> tuple[dict[str, ArmResult], Verdict, dict[str, dict[int, list[float]]]]:
    samples = samples_from_records(records)
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
    opts: ProbeOptions,
    *,
    external: bool,
    loadavg: list[float] | None = None,
) -> tuple[dict[str, ArmResult], Verdict, str]:
    """requests.parquet, nagle.json, plots/*.png, report.md; returns the printed table."""
    import pandas as pd

    from lab.report.nagle_plots import ttft_cdf, ttft_histograms

    facts = kernel_facts()
    results, verdict, samples = analyse(
        records, arms, threshold_ms=opts.threshold_ms, many=opts.many, external=external,
        facts=facts,
    )
    errors: dict[tuple[str, int], int] = {}
    for r in records:
        if not r.get("ok"):
            key = (r["arm"], int(r["level"]))
            errors[key] = errors.get(key, 0) + 1
    frame = pd.DataFrame.from_records(records)
    frame.to_parquet(out / "requests.parquet", index=False)
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
    doc = {
        "mode": "external" if external else "launched",
        "target": opts.target,
        "model": opts.model,
        "threshold_ms": opts.threshold_ms,
        "min_samples": MIN_SAMPLES,
        "requests_per_level": opts.requests,
        "options": asdict(opts),
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


def _run_dir(out: Path | None) -> Path:
    """results/<timestamp>-nagle, or --out DIR (which must be empty), like a sweep's."""
    from launch.errors import RunError
    from launch.rundir import make_run_dir

    try:
        return make_run_dir("nagle", out)
    except RunError as exc:
        raise click.BadParameter(str(exc), param_hint="--out") from exc


@click.command(name="nagle")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Run directory. [default: results/<timestamp>-nagle]")
@click.option("--requests", "n_requests", type=click.IntRange(min=1), default=DEFAULT_REQUESTS,
              show_default=True, help="Requests per arm and concurrency level.")
@click.option("--arms", default=None,
              help="Comma-separated arms, or 'all'. Launched stack: "
              + ", ".join(LAUNCHED_ARMS)
              + " [default: control,suspect]. With --target: "
              + ", ".join(EXTERNAL_ARMS)
              + " (reused always runs) [default: all].")
@click.option("--gap-ms", default=None,
              help="Idle gaps between requests, ms, comma-separated: each value > 0 adds an arm "
              "at concurrency 1 (suspect settings on the launched stack, one reused connection "
              f"with --target). [default: 0; with --target {DEFAULT_EXTERNAL_GAP_MS:g}]")
@click.option("--many", type=click.IntRange(min=2), default=DEFAULT_MANY, show_default=True,
              help="The continuous-traffic concurrency level run beside concurrency 1.")
@click.option("--threshold-ms", type=click.FloatRange(min=0, min_open=True),
              default=DEFAULT_THRESHOLD_MS, show_default=True,
              help="A stall: TTFT at least this far above the fastest decile.")
@click.option("--speedup", type=click.FloatRange(min=0), default=DEFAULT_SPEEDUP, show_default=True,
              help="Engine speedup of the launched stack (1000: the engine is nearly free).")
@click.option("--isl", type=click.IntRange(min=1), default=WorkloadSpec.isl, show_default=True,
              help="Prompt tokens per request (exact in --tokenizer's tokenizer when given).")
@click.option("--osl", type=click.IntRange(min=1), default=WorkloadSpec.osl, show_default=True,
              help="Output tokens per request.")
@click.option("--seed", type=int, default=0, show_default=True, help="Workload seed.")
@click.option("--warmup", type=click.IntRange(min=0), default=0, show_default=True,
              help="Leading requests per level left out of the statistics (0: the first request "
              "of a fresh connection is part of the signature).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), default=60.0,
              show_default=True, help="Per-request timeout, seconds.")
@prompt_form_options
@click.option("--tokenizer", default=None, metavar="PATH",
              help="A HuggingFace tokenizer.json or local model directory (no hub access): "
              "prompts of exactly --isl tokens in it; the launched stack's frontend tokenizes "
              "with it too.  [default: none: the lab frontend's word tokenizer]")
@click.option("--target", default=None,
              help="Base URL of a running OpenAI-compatible server (e.g. http://127.0.0.1:8000): "
              "nothing is launched and the arms become traffic shapes. One probe request "
              "checks it first.")
@click.option("--model", default=None,
              help="Model name. With --target: the server's only model when /v1/models lists "
              f"one, else required. [default: {DEFAULT_MODEL}]")
@click.option("--topology", "topology", default=None,
              type=click.Path(path_type=Path, dir_okay=False, exists=True),
              help="Launch each arm on this TOML topology (e.g. fleets on network hosts, see "
              "launch/topology.py) instead of one aggregated engine; each arm changes only the "
              "socket settings. --speedup is then the file's.")
@click.option("--reanalyse", "reanalyse_dir", default=None,
              type=click.Path(path_type=Path, file_okay=False, exists=True),
              help="Send nothing: recompute nagle.json, plots and report.md of an earlier "
              "probe's run directory from its requests.parquet (with --threshold-ms if given).")
def nagle(
    out: Path | None,
    n_requests: int,
    arms: str | None,
    gap_ms: str | None,
    many: int,
    threshold_ms: float,
    speedup: float,
    isl: int,
    osl: int,
    seed: int,
    warmup: int,
    timeout_s: float,
    target: str | None,
    model: str | None,
    topology: Path | None,
    reanalyse_dir: Path | None,
    prompt_kind: str | None,
    endpoint: str,
    tokenizer: str | None,
) -> None:
    """Probe the idle-connection Nagle / delayed-ACK stall and give a verdict with numbers.

    Launched stack (default): one aggregated stack per arm, each arm changing one socket
    setting (control: NODELAY on, coalesced writes; suspect: client NODELAY off and split
    writes); the same requests at concurrency 1 and at --many.

    With --target URL --model NAME: nothing is launched; the arms are traffic shapes (one reused
    connection, a fresh connection per request, idle gaps, concurrency --many, non-streaming).
    """
    if reanalyse_dir is not None:
        ctx = click.get_current_context()
        source = ctx.get_parameter_source("threshold_ms")
        explicit = source == click.core.ParameterSource.COMMANDLINE
        _finish(*reanalyse(reanalyse_dir, threshold_ms if explicit else None), reanalyse_dir)
        return
    external = target is not None
    if warmup >= n_requests:
        raise click.BadParameter(f"{warmup} must be below --requests ({n_requests})",
                                 param_hint="--warmup")
    gaps = parse_gaps(gap_ms if gap_ms is not None else
                      (f"{DEFAULT_EXTERNAL_GAP_MS:g}" if external else "0"))
    names = _csv(arms) if arms else (["all"] if external else list(DEFAULT_ARMS))
    if not names:
        raise click.BadParameter("no arm given", param_hint="--arms")
    selected = external_arms(names, gaps, many) if external else launched_arms(names, gaps, many)
    if not external and n_requests - warmup < MIN_SAMPLES:
        _log(f"note: fewer than {MIN_SAMPLES} measured requests per level: no verdict possible")
    workload = workload_from_options(
        {"isl": isl, "osl": osl, "seed": seed, "prompt_kind": prompt_kind, "endpoint": endpoint,
         "tokenizer": tokenizer}, target=target)
    opts = ProbeOptions(
        requests=n_requests, many=many, threshold_ms=threshold_ms, speedup=speedup, isl=isl,
        osl=osl, seed=seed, warmup=warmup, timeout_s=timeout_s, model=model or DEFAULT_MODEL,
        target=target.rstrip("/") if target else None,
        topology=str(topology) if topology else None,
        prompt_kind=workload.prompt_kind, endpoint=workload.endpoint,
        tokenizer=workload.tokenizer,
    )
    if topology is not None and external:
        raise click.UsageError("--topology launches a stack; it cannot be combined with --target")
    if topology is not None:
        from launch.errors import TopologyError
        from launch.topology import TopologySpec

        try:
            TopologySpec.from_toml(topology)
        except (TopologyError, ValueError) as exc:
            raise click.BadParameter(str(exc), param_hint="--topology") from exc
    import uvloop

    target_check = None
    if external:
        assert target is not None
        info = target_or_exit(target, model, workload, timeout_s)
        opts.target, opts.model, opts.include_usage = info.url, info.model, info.include_usage
        target_check = info.to_dict()
    out = _run_dir(out)
    write_config(out, {
        "mode": "external" if external else "launched",
        **asdict(opts),
        "arms": [a.to_dict() for a in selected],
        "target_check": target_check,
    })
    if external:
        records = uvloop.run(run_external(selected, opts))
    else:
        records = uvloop.run(_launched_or_fail(selected, opts, out))
    _, verdict, table = write_outputs(out, records, selected, opts, external=external)
    _finish(table, verdict, out)


def _finish(table: str, verdict: Verdict, out: Path) -> None:
    click.echo(table)
    click.echo("")
    click.echo(verdict.text)
    for line in verdict.lines:
        click.echo(f"  {line}")
    click.echo(f"\nrun directory: {out}")


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
    known = {f.name for f in fields(ProbeOptions)}
    opts = ProbeOptions(**{k: v for k, v in stored.items() if k in known})
    if threshold_ms is not None:
        opts.threshold_ms = threshold_ms
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


async def _launched_or_fail(arms: list[Arm], opts: ProbeOptions, out: Path) -> list[dict]:
    from launch.errors import LaunchError

    try:
        return await run_launched(arms, opts, out)
    except LaunchError as exc:
        raise click.ClickException(str(exc)) from exc
