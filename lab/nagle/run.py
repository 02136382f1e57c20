"""Running the arms of `lab nagle`: one launched stack per arm, or traffic shapes on --target.

Each arm sends the same requests at concurrency 1 on a persistent connection and then at
concurrency `--many`; the records are the load client's, tagged with the arm and the level.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import click

from lab.load.workload import RequestSet
from lab.nagle.arms import Arm
from lab.nagle.settings import NagleSettings


def progress(msg: str) -> None:
    """A progress line on stderr (stdout carries the table and the verdict)."""
    click.echo(msg, err=True)


def _bodies(opts: NagleSettings, model: str, arm: Arm, conc: int,
            level_seed: int) -> RequestSet:
    return RequestSet(opts.workload(stream=arm.stream), model, level_seed, opts.requests)


async def _run_arm_levels(url: str, model: str, arm: Arm, opts: NagleSettings,
                          seed_of: Callable[[Arm, int], int]) -> list[dict]:
    from lab.load.client import run_level
    from lab.load.client_settings import ClientSettings

    records: list[dict] = []
    for conc in arm.levels:
        bodies = _bodies(opts, model, arm, conc, seed_of(arm, conc))
        copts = ClientSettings(in_process_client=True,
            fresh_connection=arm.fresh_connection,
            gap_ms=arm.gap_ms,
            timeout=opts.timeout_s,
            request_id_prefix=f"nagle-{arm.name}-c{conc}-",
        )
        t0 = time.monotonic()
        res = await run_level(url, bodies, conc, warmup=opts.warmup, options=copts)
        errors = sum(1 for r in res.records if not r.ok)
        progress(
            f"  {arm.name} c={conc}: {len(res.records)} requests, {errors} failed, "
            f"{time.monotonic() - t0:.1f} s"
        )
        if errors and all(not r.ok for r in res.records):
            first = res.records[0]
            raise click.ClickException(
                f"arm {arm.name}: every request failed at concurrency {conc}: "
                f"{first.error_kind}: {first.error_message}"
            )
        records.extend({**r.row(), "arm": arm.name, "level": conc} for r in res.records)
    return records


async def run_launched(arms: list[Arm], opts: NagleSettings, out: Path) -> list[dict]:
    """One aggregated stack per arm, torn down before the next; the same requests in every arm."""
    from launch.stack import Stack
    from launch.topology import TopologySpec

    assert opts.model is not None  # resolved by the command
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
        progress(f"arm {arm.name}: {arm.label} -- launching the stack")
        async with Stack(spec, out / "arms" / arm.name) as stack:
            records.extend(
                await _run_arm_levels(stack.frontend_url, stack.model, arm, opts,
                                      lambda _a, conc: conc)
            )
    return records


async def run_external(arms: list[Arm], opts: NagleSettings) -> list[dict]:
    """Traffic shapes against --target. Each arm gets its own prompts (a distinct level seed),
    so no arm is served from a prefix cache another arm warmed."""
    assert opts.target is not None and opts.model is not None  # resolved by the command
    records: list[dict] = []
    seeds = {a.name: 1000 * (i + 1) for i, a in enumerate(arms)}
    for arm in arms:
        progress(f"arm {arm.name}: {arm.label}")
        records.extend(
            await _run_arm_levels(opts.target, opts.model, arm, opts,
                                  lambda a, conc: seeds[a.name] + conc)
        )
    return records



async def launched_or_fail(arms: list[Arm], opts: NagleSettings, out: Path) -> list[dict]:
    from launch.errors import LaunchError

    try:
        return await run_launched(arms, opts, out)
    except LaunchError as exc:
        raise click.ClickException(str(exc)) from exc
