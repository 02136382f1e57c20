"""`lab calibrate --target URL`: measure a serving stack with a designed probe set and fit the
lab mocker's timing to it: the `linear` pass model and the `profile` curves (docs/fidelity.md)."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from lab.commands.sweep import make_dir
from lab.fidelity import probes as P
from lab.fidelity.placement import Placement, checked_probes, placed
from lab.fidelity.placement import measure as measure_placement
from lab.fidelity.target_engine import TargetEngine, added_prompt_tokens, read_target_engine
from lab.load.client_settings import ClientSettings
from lab.shared.config_cli import MAX_SECONDS, FiniteFloatRange
from lab.sweep.run_options import TARGET_MODEL_HELP, option_of, run_client, run_dir_options
from lab.sweep.sweep_settings import SweepSettings
from lab.sweep.target import prompt_form_options, target_or_exit, workload_from_options
from launch.topology_settings import TopologySettings
from mocker.engine.config import DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS

#: the timing models `lab calibrate` fits, in the order `auto` prefers them on a tie
TIMING_FITS = ("linear", "profile")
#: --timing: a fitted model, or `auto`: the one whose replay of the batch probes is closer
TIMING_CHOICES = ("auto", *TIMING_FITS)
LAB_PATH_OSL = 2  # the lab-path probes need a first token only (and one gap to be a stream)
LAB_PATH_REQUESTS = 40
#: The lab-path stack's engine sleeps a known time (`fixed` timing), so that its path includes
#: the engine's timer wake-up, as it will when the fitted profile runs; this is subtracted back.
LAB_PATH_PREFILL_MS = 10.0
LAB_PATH_DECODE_MS = 1.0


def parse_ints(value: str, option: str) -> tuple[int, ...]:
    """'64,256,1024' -> (64, 256, 1024), sorted and unique; BadParameter naming `option`."""
    try:
        items = sorted({int(v) for v in str(value).split(",") if v.strip()})
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected comma-separated positive integers",
                                 param_hint=f"'{option}'") from None
    if not items or items[0] < 1:
        raise click.BadParameter(f"{value!r}: expected comma-separated positive integers",
                                 param_hint=f"'{option}'")
    return tuple(items)


def parse_share(value: str) -> str:
    """--request-after-share: `auto`, or a number from 0 to 1 (as given)."""
    if value.strip().lower() == "auto":
        return "auto"
    try:
        share = float(value)
    except ValueError:
        share = math.nan
    if not 0.0 <= share <= 1.0:
        raise click.BadParameter(f"must be auto or a number from 0 to 1, got {value!r}",
                                 param_hint="'--request-after-share'")
    return value.strip()


def say_to_stderr(quiet: bool) -> Any:
    """A progress printer: a line on stderr, or nothing with --quiet."""
    return (lambda text: None) if quiet else (lambda text: click.echo(text, err=True))


@click.command()
@option_of(SweepSettings, "target", required=True,
           help="The OpenAI-compatible server to measure (e.g. http://127.0.0.1:8787).")
@option_of(TopologySettings, "model", help=TARGET_MODEL_HELP)
@option_of(TopologySettings, "tokenizer",
           help="The target's tokenizer (tokenizer.json or a model dir): prompts of "
           "exactly the probe lengths, and the lab stack that measures its own path "
           "tokenizes with it too.")
@prompt_form_options
@click.option("--context-isl", default=None, metavar="LIST",
              help="Prompt lengths of the concurrency-1 probes (prefill from their TTFT, decode "
              "over context length from their token gaps).  [default: "
              f"{','.join(map(str, P.DEFAULT_CONTEXT_ISL))}, and --max-num-batched-tokens when "
              "larger (a full pass) and the target's context length allows]")
@click.option("--context-osl", type=click.IntRange(2, 100_000), default=P.DEFAULT_CONTEXT_OSL,
              show_default=True, help="Output tokens of the concurrency-1 probes.")
@click.option("--context-requests", type=click.IntRange(1, 100_000),
              default=P.DEFAULT_CONTEXT_REQUESTS, show_default=True,
              help="Measured requests per concurrency-1 probe.")
@click.option("--overlap-osl", type=click.IntRange(0, 100_000), default=P.DEFAULT_OVERLAP_OSL,
              show_default=True,
              help="Mean output tokens of the concurrency-2 overlap probes at each "
              "--context-isl (the engine's prefill seen from another stream, which separates it "
              "from the target's HTTP and routing path); 0 = none.")
@click.option("--overlap-requests", type=click.IntRange(2, 100_000),
              default=P.DEFAULT_OVERLAP_REQUESTS, show_default=True,
              help="Measured requests per overlap probe.")
@click.option("--batch-conc", default=",".join(map(str, P.DEFAULT_BATCH_CONC)),
              show_default=True, metavar="LIST",
              help="Concurrency levels of the decode probes (decode step time over the batch's "
              "KV tokens, from the token gaps without prefill).")
@click.option("--batch-isl", default=",".join(map(str, P.DEFAULT_BATCH_ISL)), show_default=True,
              metavar="LIST", help="Prompt lengths of the decode probes (each at every "
              "--batch-conc).")
@click.option("--batch-osl", type=click.IntRange(2, 100_000), default=P.DEFAULT_BATCH_OSL,
              show_default=True, help="Output tokens of the decode probes (long enough that "
              "most engine passes carry no prefill).")
@click.option("--batch-rounds", type=click.IntRange(1, 1000), default=P.DEFAULT_BATCH_ROUNDS,
              show_default=True,
              help="Measured requests per decode probe, in rounds of its concurrency.")
@click.option("--prefix-isl", type=click.IntRange(0, 1_000_000), default=P.DEFAULT_PREFIX_ISL,
              show_default=True,
              help="Prompt length of the repeated-prompt probe (prefix-cache effect); 0 = none.")
@click.option("--timing", "timing_model", type=click.Choice(TIMING_CHOICES), default="auto",
              show_default=True,
              help="The timing model engine-args.json runs: linear (a pass costs what is in it: "
              "its tokens, sequences, the KV its decodes attend to and its prefill attention; "
              "fits a real engine's batching), profile (prefill over tokens and decode over "
              "KV tokens, interpolated), or auto: the one whose offline replay of the batch "
              "probes (closed loops whose requests share passes) comes closer to the target's "
              "TTFT and latency p50s. Both are fitted and written "
              "(engine-args-linear.json, engine-args-profile.json).")
@click.option("--request-after-share", "request_after_share", default="auto",
              show_default=True, metavar="auto|SHARE",
              help="How much of the fitted per-request latency (the target's path beyond the "
              "lab's) comes after the request's first pass (the first token's way out) "
              "instead of before the engine's scheduler: a share from 0 to 1, or auto: run the "
              "overlap probes on lab stacks with it all before and all after, and keep the "
              "share whose newcomers wait for a pass as long as the target's do. A one-stream "
              "TTFT cannot tell them apart; under load it decides which requests share "
              "passes.")
@click.option("--max-num-batched-tokens", type=click.IntRange(1, 10_000_000), default=None,
              metavar="N",
              help="The target's token budget per pass (vLLM's --max-num-batched-tokens: 2048 "
              "on CPU, 8192 on GPU). No target publishes it.  [default: the lab mocker's, "
              f"{DEFAULT_MAX_NUM_BATCHED_TOKENS}]")
@click.option("--max-num-seqs", type=click.IntRange(1, 1_000_000), default=None, metavar="N",
              help="The target's most sequences per pass (vLLM's --max-num-seqs). No target "
              f"publishes it.  [default: the lab mocker's, {DEFAULT_MAX_NUM_SEQS}]")
@click.option("--engine-type", type=click.Choice(["trtllm", "vllm"]), default="trtllm",
              show_default=True,
              help="Admission policy of the fitted lab mocker (where its first_token_decode "
              "default is on, the fit subtracts that step from prefill; off for both today).")
@click.option("--lab-path-ms", type=FiniteFloatRange(min=0, max=MAX_SECONDS * 1000),
              default=None, metavar="MS",
              help="The lab's own HTTP + request-plane + gRPC time to first token, subtracted "
              "from the target's TTFT.  [default: measured on a lab stack with a fixed, "
              "subtracted engine time, at each probe length]")
@option_of(ClientSettings, "timeout", ("--timeout", "timeout_s"), default=120.0,
           show_default=True, help="Per-request timeout.")
@run_dir_options("calibrate")
def calibrate(**kw: Any) -> None:
    """Measure a real stack at --target and fit the lab mocker's timing to it.

    Probes (each a closed-loop level, concurrency 1 unless said): TTFT over --context-isl;
    at each of those lengths two streams out of step (concurrency 2), where one stream's gap
    that held the other's prefill is the engine's prefill alone; token gaps at each
    --batch-conc crossed with --batch-isl give the decode step over the sequences that share
    it and the KV tokens they attend to; one repeated prompt shows the prefix-cache effect.

    The `linear` model (the default) writes each probe figure as a sum of passes, each pass a
    linear function of what is in it, plus the target's per-request path beyond the lab's
    own (measured on a lab stack whose engine takes a known time), and fits the non-negative
    coefficients by least squares; fit.md shows each probe's residual. The `profile` model
    interpolates prefill over tokens and decode over KV tokens. What the target publishes of
    its engine (vLLM: block size, KV blocks and prefix caching on /metrics) goes into the
    engine args; what it does not (the pass token budget, the sequence limit) comes from
    --max-num-batched-tokens and --max-num-seqs, and fit.md says which were assumed.

    Where the per-request latency sits (before the scheduler, or after the request's first
    pass) is measured by running the overlap probes again on lab stacks (placement/).

    Writes RUN/: probes/<probe>/ (a sweep run directory each), lab-path/, placement/,
    engine-args.json
    (use it with `lab sweep --engine-args`, `lab up` or `lab fidelity`), engine-args-linear.json,
    engine-args-profile.json with profile.csv, fit.json, fit.md and plots/fit.png.
    """
    budget = kw["max_num_batched_tokens"] or DEFAULT_MAX_NUM_BATCHED_TOKENS
    probe_set = P.ProbeSet(
        context_isl=(parse_ints(kw["context_isl"], "--context-isl") if kw["context_isl"]
                     else P.DEFAULT_CONTEXT_ISL),
        context_osl=kw["context_osl"], context_requests=kw["context_requests"],
        batch_conc=parse_ints(kw["batch_conc"], "--batch-conc"),
        batch_isl=parse_ints(kw["batch_isl"], "--batch-isl"),
        batch_osl=kw["batch_osl"], batch_rounds=kw["batch_rounds"],
        prefix_isl=kw["prefix_isl"] or None, overlap_osl=kw["overlap_osl"] or None,
        overlap_requests=kw["overlap_requests"])
    if kw["lab_path_ms"] is not None and not (math.isfinite(kw["lab_path_ms"])
                                              and kw["lab_path_ms"] >= 0):
        raise click.BadParameter("must be a finite number >= 0", param_hint="'--lab-path-ms'")
    kw["request_after_share"] = parse_share(kw["request_after_share"])
    workload = workload_from_options(
        {**kw, "isl": probe_set.context_isl[0], "osl": probe_set.context_osl, "seed": 0},
        target=kw["target"])
    say = say_to_stderr(kw["quiet"])
    info = target_or_exit(kw["target"], kw["model"], workload, kw["timeout_s"],
                          quiet=kw["quiet"])
    workload = replace(workload, include_usage=info.include_usage)
    target_engine = read_target_engine(info.url, info.model)
    target_engine.added_prompt_tokens = added_prompt_tokens(info, workload.tokenizer)
    if not kw["context_isl"]:
        probe_set = replace(probe_set, context_isl=P.default_context_isl(
            budget, target_engine.max_model_len, probe_set.context_osl))
    probe_set = replace(probe_set, added=target_engine.added_prompt_tokens)
    run_dir = make_dir(kw["name"], kw["out"])
    from launch.config import write_config

    write_config(run_dir, extra={"calibrate": {
        "target": info.url, "model": info.model, "target_check": info.to_dict(),
        "probes": probe_set.to_dict(), "workload": workload.to_dict(),
        "engine_type": kw["engine_type"], "lab_path_ms": kw["lab_path_ms"],
        "target_engine": target_engine.to_dict(), "argv": sys.argv}})
    sys.exit(run_calibration(run_dir, info.url, info.model, probe_set, workload, kw, say,
                             target_engine))


def run_calibration(run_dir: Path, url: str, model: str, probe_set: P.ProbeSet,
                    workload: Any, kw: dict, say: Any,
                    target_engine: TargetEngine | None = None) -> int:
    import uvloop

    from lab.fidelity.fit import engine_args, fit_profile, write_profile
    from lab.fidelity.fit_report import fit_markdown
    from lab.fidelity.pass_fit import fit_linear, linear_engine_args
    from lab.fidelity.replay import best_model, replay_probes
    from lab.load.priority import on_this_machine
    from lab.load.sweep import LevelFailed, LineProgress
    from launch.errors import LaunchError

    client = run_client(kw, kw["timeout_s"])
    progress = LineProgress(quiet=kw["quiet"])
    try:
        results, lab_path = uvloop.run(measure(run_dir, url, model, probe_set, workload, kw,
                                               client, progress, say))
    except LevelFailed as exc:
        click.echo(f"error: the target failed a probe: {exc}", err=True)
        return 1
    except LaunchError as exc:
        click.echo(f"error: the lab stack (lab path) did not start: {exc.message()}", err=True)
        return 1
    except (KeyboardInterrupt, RuntimeError, OSError) as exc:
        click.echo(f"error: {exc or 'interrupted'}", err=True)
        return 130 if isinstance(exc, KeyboardInterrupt) else 1
    scheduler = scheduler_args(kw, target_engine or TargetEngine())
    try:
        fit = fit_profile(results, lab_path, kw["engine_type"],
                          budget=scheduler["max_num_batched_tokens"])
        linear = fit_linear(results, lab_path, scheduler["max_num_batched_tokens"])
    except ValueError as exc:
        click.echo(f"error: {exc}", err=True)
        return 1
    if not client.client_realtime and on_this_machine(url):
        fit.warnings.append(
            "the target runs on this machine and the load client ran at normal priority: "
            "where the target keeps the cores busy, the client's wait for a core lands in the "
            "probes (vLLM on 2 cores: c=1 decode steps a quarter higher); --client-realtime "
            "keeps it out (docs/fidelity.md \"The client's scheduling\")")
    profile = write_profile(fit, run_dir / "profile.csv")
    written = {"profile": {**engine_args(fit, profile), **scheduler},
               "linear": {**linear_engine_args(linear, fit, kw["engine_type"]), **scheduler}}
    for name, args in written.items():
        (run_dir / f"engine-args-{name}.json").write_text(json.dumps(args, indent=2) + "\n")
    replays = replay_probes(results, written, lab_path)
    chosen = kw["timing_model"]
    if chosen == "auto":
        chosen = best_model(replays, TIMING_FITS)
    try:
        placement = uvloop.run(place_request_latency(
            written[chosen], results, run_dir, probe_set, workload, kw, client, progress, say))
    except LevelFailed as exc:
        click.echo(f"error: the lab stack failed an overlap probe: {exc}", err=True)
        return 1
    except LaunchError as exc:
        click.echo(f"error: the lab stack (request placement) did not start: {exc.message()}",
                   err=True)
        return 1
    except (KeyboardInterrupt, RuntimeError, OSError) as exc:
        click.echo(f"error: {exc or 'interrupted'}", err=True)
        return 130 if isinstance(exc, KeyboardInterrupt) else 1
    if placement.share:
        written[chosen] = placed(written[chosen], placement.share)
        (run_dir / f"engine-args-{chosen}.json").write_text(
            json.dumps(written[chosen], indent=2) + "\n")
    (run_dir / "engine-args.json").write_text(json.dumps(written[chosen], indent=2) + "\n")
    (run_dir / "fit.json").write_text(json.dumps(
        {**fit.to_dict(), "linear": linear.to_dict(), "scheduler": scheduler,
         "target_engine": (target_engine or TargetEngine()).to_dict(),
         "timing": {"asked": kw["timing_model"], "chosen": chosen},
         "request_placement": {"asked": kw["request_after_share"], **placement.to_dict()},
         "replay": [r.to_dict() for r in replays],
         "probes": [r.to_dict() for r in results]}, indent=2, default=str) + "\n")
    plot = None
    if not kw["no_plots"]:
        from lab.fidelity.fit_plot import fit_plot

        plot = fit_plot(fit, results, run_dir / "plots" / "fit.png")
    text = fit_markdown(fit, results, url, plot, linear=linear,
                        assumed=assumed_settings(kw, target_engine or TargetEngine()),
                        replays=replays, timing=(kw["timing_model"], chosen),
                        placement=placement)
    (run_dir / "fit.md").write_text(text)
    click.echo(text)
    click.echo(f"engine args ({chosen}): {run_dir / 'engine-args.json'}")
    return 0


async def place_request_latency(args: dict[str, Any], results: list[P.ProbeResult],
                                run_dir: Path, probe_set: P.ProbeSet, workload: Any, kw: dict,
                                client: Any, progress: Any, say: Any) -> Placement:
    """How much of `args`' request latency comes after the first pass
    (lab/fidelity/placement.py): as --request-after-share says, or measured on lab stacks."""
    asked = kw["request_after_share"]
    if asked != "auto":
        share = float(asked)
        if share and args["timing"].get("request_mode", "delay") != "delay":
            return Placement(skipped=f"--request-after-share {asked}: the fit read a "
                             f"{args['timing']['request_mode']}, which has no share")
        return Placement(share=share, skipped=f"--request-after-share {asked}")
    if kw["lab_path_ms"] is not None:
        return Placement(skipped="--lab-path-ms: no lab stack is launched")
    budget = args.get("max_num_batched_tokens", DEFAULT_MAX_NUM_BATCHED_TOKENS)
    usable, why = checked_probes(args, results, budget)
    if not usable:
        return Placement(skipped=why)
    return await measure_placement(args, usable, run_dir / "placement", kw["tokenizer"],
                                   probe_set.added > 0, workload, client, progress, say)


def scheduler_args(kw: dict, target: TargetEngine) -> dict[str, Any]:
    """The engine args of the target's scheduler and KV cache: what it publishes, then the
    options, then the lab mocker's defaults."""
    out: dict[str, Any] = {
        "max_num_batched_tokens": kw["max_num_batched_tokens"] or DEFAULT_MAX_NUM_BATCHED_TOKENS,
        "max_num_seqs": kw["max_num_seqs"] or DEFAULT_MAX_NUM_SEQS}
    out.update(target.args)
    return out


def assumed_settings(kw: dict, target: TargetEngine) -> list[str]:
    """Sentences for fit.md: which scheduler settings were read, given, or assumed."""
    lines = [f"`{k}` = {v} read from the target ({target.sources.get(k, 'published')})"
             for k, v in target.args.items()]
    for name, default in (("max_num_batched_tokens", DEFAULT_MAX_NUM_BATCHED_TOKENS),
                          ("max_num_seqs", DEFAULT_MAX_NUM_SEQS)):
        flag = "--" + name.replace("_", "-")
        if kw[name]:
            lines.append(f"`{name}` = {kw[name]} from {flag}")
        else:
            lines.append(f"`{name}` = {default} ASSUMED (the lab mocker's default; the target "
                         f"does not publish it: give {flag})")
    if not target.args:
        lines.append("the target published no cache configuration (vLLM does on /metrics "
                     "unless started with --disable-log-stats): block size, KV blocks and "
                     "prefix caching are the lab mocker's")
    if target.max_model_len:
        lines.append(f"the target's max_model_len is {target.max_model_len} (/v1/models)")
    if target.added_prompt_tokens:
        lines.append(f"the target counts {target.added_prompt_tokens} more prompt token(s) than "
                     "the ISL (its tokenizer's special tokens, a BOS; the probe's usage): the "
                     "fit takes each probe's prompt as that many tokens more, and the lab's "
                     "path was measured with them (--add-special-tokens)")
    return lines


async def measure(run_dir: Path, url: str, model: str, probe_set: P.ProbeSet, workload: Any,
                  kw: dict, client: Any, progress: Any,
                  say: Any) -> tuple[list[P.ProbeResult], dict[int, float]]:
    """The target's probes; and, unless --lab-path-ms is given, the lab's own path: TTFT p50 of
    a lab stack whose engine takes a known fixed time (subtracted), at each context length,
    each measured right after the target's probe of that length."""
    probes = probe_set.probes()
    if kw["lab_path_ms"] is not None:
        results = await P.run_probes(probes, url, model, workload, run_dir / "probes", client,
                                     progress, say)
        return results, {isl: float(kw["lab_path_ms"]) for isl in probe_set.context_isl}
    from lab.fidelity.lab_stack import lab_spec, on_stack

    out_dir = run_dir / "lab-path"
    out_dir.mkdir()
    # no first-token decode step: the engine's time to the first token is the prefill alone
    fixed = {"engine_type": kw["engine_type"], "first_token_decode": False,
             "timing": {"type": "fixed", "prefill_ms": LAB_PATH_PREFILL_MS,
                        "decode_ms": LAB_PATH_DECODE_MS}}
    engine_ms = LAB_PATH_PREFILL_MS
    spec = lab_spec(speedup=1.0, tokenizer=kw["tokenizer"], name="lab-path",
                    engine_args=json.dumps(fixed))
    # the lab's path for the prompts the target computes (its BOS too)
    spec.add_special_tokens = probe_set.added > 0

    async def work(lab_url: str, lab_model: str) -> tuple[list[P.ProbeResult], dict[int, float]]:
        lab_path: dict[int, float] = {}

        async def after(probe: P.Probe) -> None:
            if probe.kind != "context":
                return
            own = P.Probe("context", probe.isl, LAB_PATH_OSL, 1, LAB_PATH_REQUESTS, 2,
                          probe.seed + 5000)
            say(f"  lab path at {probe.isl} tokens: {own.name}")
            r = await P.run_probe(own, lab_url, lab_model, workload, out_dir / own.name,
                                  client, progress)
            lab_path[probe.isl] = r.ttft_ms_p50 - engine_ms

        results = await P.run_probes(probes, url, model, workload, run_dir / "probes", client,
                                     progress, say, after)
        return results, lab_path

    return await on_stack(spec, out_dir / "stack", say, work)
