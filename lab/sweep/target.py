"""What `lab sweep` and `lab nagle` share for --target and the workload options: the workload
from --isl/--osl/--prompt-kind/--endpoint/--tokenizer, and the one target check
(lab.load.target_check) turned into a click error (exit 2) naming the option to change."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from lab.load.workload import LAB_PROMPT_KIND, TARGET_PROMPT_KIND, WorkloadSpec
from lab.shared.config_cli import field_option
from lab.sweep.sweep_settings import SweepSettings


def prompt_form_options(func: Callable) -> Callable:
    """--prompt-kind and --endpoint, generated from `SweepSettings`' fields (the same names,
    help and defaults in `lab nagle` as in `lab sweep`)."""
    for name in ("endpoint", "prompt_kind"):
        decls, kwargs = field_option(SweepSettings, name)
        func = click.option(*decls, **kwargs)(func)
    return func


def workload_from_options(kw: dict, *, target: str | None) -> WorkloadSpec:
    """The workload of --isl/--osl/--prompt-kind/--endpoint/--tokenizer...; bad input gets a
    message naming the option (shared by `lab sweep` and `lab nagle`)."""
    tokenizer = kw.get("tokenizer")
    if tokenizer is not None:
        from lab.shared.hf_tokenizer import TokenizerFileError, load_hf, tokenizer_json

        try:
            load_hf(tokenizer)
            tokenizer = str(tokenizer_json(tokenizer))
        except TokenizerFileError as exc:
            raise click.BadParameter(str(exc), param_hint="'--tokenizer'") from None
    kind = kw.get("prompt_kind") or (
        TARGET_PROMPT_KIND if target or tokenizer else LAB_PROMPT_KIND)
    if tokenizer is not None and kind == "words":
        raise click.BadParameter("'words' is the lab word tokenizer's <token:N> form; with "
                                 "--tokenizer use text or token_ids", param_hint="'--prompt-kind'")
    try:
        return WorkloadSpec(isl=kw["isl"], osl=kw["osl"], isl_stddev=kw.get("isl_stddev") or 0.0,
                            osl_stddev=kw.get("osl_stddev") or 0.0, seed=kw["seed"],
                            shared_prefix=kw.get("shared_prefix") or 0, prompt_kind=kind,
                            endpoint=kw["endpoint"], tokenizer=tokenizer)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def target_or_exit(target: str, model: str | None, workload: WorkloadSpec, timeout_s: float,
                   quiet: bool = False) -> Any:
    """The shared target check (lab.load.target_check); a failure exits 2 with its message."""
    import uvloop

    from lab.load.target_check import DEFAULT_TIMEOUT_S as PROBE_TIMEOUT_S
    from lab.load.target_check import TargetError, check_target

    try:
        info = uvloop.run(check_target(target, model, workload,
                                       timeout_s=min(timeout_s, PROBE_TIMEOUT_S)))
    except TargetError as exc:
        raise click.BadParameter(exc.message, param_hint=f"'{exc.option}'") from None
    if not quiet:
        reported = (f", server counted {info.probe_prompt_tokens} prompt tokens for "
                    f"{info.probe_isl} requested" if info.probe_prompt_tokens is not None else "")
        click.echo(f"target {info.url}: model {info.model}, streams{reported}", err=True)
        for note in info.notes:
            click.echo(f"  note: {note}", err=True)
    return info
