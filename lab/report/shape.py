"""The load's shape in words, from the sweep's config section: closed loop, request rates,
a trace replay or conversations (the report's and `lab compare`'s header say it)."""

from __future__ import annotations

from typing import Any


def load_shape(sweep: dict[str, Any]) -> str:
    """'closed loop at c=1,32', 'open loop: rates 20, 50/s, poisson arrivals', 'trace replay
    of FILE: N requests at 1x (20.5 req/s offered), blocks of 512 tokens', and for --turns
    ', conversations of N turns, think time T ms'."""
    trace = sweep.get("trace")
    if trace:
        text = (f"trace replay of {trace['path']}: {trace['requests']} requests at "
                f"{trace['speed']:g}x the trace's times ({trace['offered_req_s']:.3g} req/s "
                f"offered), hash_ids blocks of {trace['block_size']} tokens")
    elif sweep.get("rates"):
        rates = sweep["rates"]
        listed = rates if isinstance(rates, str) else ", ".join(f"{r:g}" for r in rates) + "/s"
        text = f"open loop: rates {listed}, {sweep.get('arrival', 'poisson')} arrivals"
    else:
        levels = ",".join(str(c) for c in sweep.get("concurrency") or [])
        text = f"closed loop at c={levels}" if levels else "closed loop"
    search = sweep.get("search")
    if search:
        goal = (f"at least {100 * search['slo_share']:g}% of requests meeting every SLO"
                if search.get("slo_share") else "sustained")
        text += (f", searched by {search['axis']} ({goal}; at most {search['max_levels']} "
                 "levels)")
    if sweep.get("ramp_up_s"):
        text += f", each level ramped up over {sweep['ramp_up_s']:g} s first (not measured)"
    if sweep.get("max_concurrency"):
        text += f", at most {sweep['max_concurrency']} in flight"
    conv = sweep.get("conversations")
    if conv:
        text += (f"; conversations of {conv['turns']} turns, each turn sent "
                 f"{conv['think_ms']:g} ms after the previous answer, with the history")
    return text
