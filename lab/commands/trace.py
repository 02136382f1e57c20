"""`lab trace synth`: write a mooncake-format trace for `lab sweep --trace` (lab.load.trace_synth).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from lab.load.trace_settings import TraceSettings, TraceSynthSettings
from lab.shared.config_cli import options

if TYPE_CHECKING:
    from lab.load.client_settings import ClientSettings
    from lab.load.conversation_settings import ConversationSettings
    from lab.load.sweep import TracePlan
    from lab.load.workload import WorkloadSpec
    from lab.open_loop.arrival_settings import ArrivalSettings
    from lab.sweep.sweep_settings import SweepSettings


def check_trace_conflicts(arrival: ArrivalSettings, *, conc_given: bool) -> None:
    """--trace sets the load's shape itself: --conc and --rate are refused beside it."""
    if arrival.rate:
        raise click.UsageError("--trace and --rate are alternatives: a trace replay sends at "
                               "the trace's times (use --trace-speed to scale them)")
    if conc_given:
        raise click.UsageError("--trace and --conc are alternatives: a trace replay is open "
                               "loop (use --max-concurrency to cap the requests in flight)")


def check_conversation_conflicts(conversation: ConversationSettings, settings: SweepSettings,
                                 arrival: ArrivalSettings, client: ClientSettings, *,
                                 trace: bool) -> None:
    """--turns runs conversations on the chat endpoint, in one client process, counted."""
    if conversation.turns == 1:
        raise click.UsageError("--think-ms is the pause between a conversation's turns: it "
                               "needs --turns 2 or more")
    if settings.endpoint != "chat":
        raise click.UsageError("--turns needs --endpoint chat (a turn sends the history as "
                               "chat messages)")
    if trace:
        raise click.UsageError("--turns and --trace are alternatives: a trace sets each "
                               "request itself")
    for given, flag in ((arrival.max_concurrency, "--max-concurrency"),
                        (client.client_procs > 1, "--client-procs"),
                        (settings.duration, "--duration")):
        if given:
            raise click.UsageError(f"--turns with {flag} is not supported: conversations run "
                                   "in one client process, a counted number per level")


def trace_plan(settings: TraceSettings, workload: WorkloadSpec, limit: int | None
               ) -> TracePlan:
    """The replay of --trace (its first `limit` requests with --requests); a bad trace is a
    usage error naming the file and line."""
    from lab.load.sweep import TracePlan
    from lab.load.trace import TraceError, read_trace

    assert settings.trace is not None
    if workload.endpoint == "chat" and workload.tokenizer is not None:
        raise click.UsageError("--trace sends the trace's blocks as token ids, or on the chat "
                               "endpoint as the lab word tokenizer's <token:N> words: chat with "
                               "--tokenizer cannot carry them exactly")
    try:
        requests = read_trace(settings.trace, settings.trace_block_size)
    except TraceError as exc:
        raise click.BadParameter(str(exc), param_hint="'--trace'") from None
    id_max = None
    if workload.tokenizer is not None:
        from lab.shared.hf_tokenizer import load_hf

        id_max = load_hf(workload.tokenizer).get_vocab_size() - 1
    return TracePlan(str(settings.trace), requests[:limit] if limit else requests,
                     settings.trace_speed, settings.trace_block_size, id_max)


@click.group()
def trace() -> None:
    """Traces for `lab sweep --trace` (mooncake JSONL)."""


@trace.command()
@options(TraceSynthSettings)
def synth(settings: TraceSynthSettings) -> None:
    """Write a synthetic trace: chosen arrivals, lengths and prefix reuse (seeded)."""
    from lab.load.trace import MOONCAKE_BLOCK_SIZE, expected_cached_tokens, write_trace
    from lab.load.trace_synth import synth_trace

    requests = synth_trace(settings.spec())
    try:
        write_trace(settings.out, requests)
    except OSError as exc:
        raise click.BadParameter(f"cannot write the trace: {exc}", param_hint="'--out'") from None
    cached = sum(expected_cached_tokens(requests, settings.block_size))
    prompt = sum(r.input_length for r in requests)
    span = requests[-1].timestamp_ms / 1000
    block = "" if settings.block_size == MOONCAKE_BLOCK_SIZE else \
        f" (replay with --trace-block-size {settings.block_size})"
    click.echo(f"wrote {settings.out}: {len(requests)} requests over {span:.1f} s, "
               f"{prompt:,} prompt tokens of which {100 * cached / prompt:.1f}% reused "
               f"blocks{block}")
