"""Run a coroutine against a launched lab stack: what `lab calibrate` (the lab's own path) and
`lab fidelity` (the lab side of the comparison) share."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from launch.cli_options import spec_from_options

T = TypeVar("T")

def lab_spec(*, engine_args: str | None = None, speedup: float | None = None,
             tokenizer: str | None = None, disagg: bool = False,
             name: str = "lab") -> Any:
    """A one-engine aggregated (or 1 prefill + 1 decode) lab topology; bad engine args are a
    usage error naming --engine-args."""
    spec = spec_from_options(engine_args=engine_args, speedup=speedup, tokenizer=tokenizer,
                             disagg=True if disagg else None, name=name)
    if engine_args is not None:
        check_engine_args(spec)
    return spec


def check_engine_args(spec: Any) -> None:
    """Build each fleet's engine args and timing model here, so that a bad file (an unknown
    key, a profile CSV that does not load) fails before anything is launched."""
    from mocker.engine.config import EngineArgs
    from mocker.engine.timing import TimingModel

    for fleet in spec.fleets:
        try:
            TimingModel(EngineArgs.from_json(dict(fleet.engine_args)))
        except (ValueError, TypeError) as exc:
            raise click.BadParameter(str(exc), param_hint="'--engine-args'") from None


async def on_stack(spec: Any, run_dir: Path, say: Callable[[str], None],
                   work: Callable[[str, str], Awaitable[T]]) -> T:
    """Launch `spec` into `run_dir`, await `work(frontend_url, model)`, tear it down."""
    from launch.stack import Stack

    say(f"launching the lab stack ({', '.join(f'{f.count}x {f.role}' for f in spec.fleets)})"
        f" -> {run_dir}")
    async with Stack(spec, run_dir) as stack:
        say(f"lab stack ready: {stack.frontend_url}")
        return await work(stack.frontend_url, stack.model)
