"""What a run's requests say about the server, beyond speed: prompt and completion tokens
requested vs reported by the server (usage), the chat template's overhead, and levels where
every request failed.

Template overhead: on /v1/chat/completions the server wraps the messages in its chat template,
so its usage.prompt_tokens is ISL plus a constant; the overhead is the median over requests of
(server prompt tokens - requested ISL). On /v1/completions there is no template and the
overhead is 0. A level is flagged when the server's mean prompt tokens differ from ISL plus the
overhead by more than TOKEN_TOLERANCE of ISL, or its completion tokens from OSL by more than
TOKEN_TOLERANCE of OSL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from lab.analysis.stats import cancelled_mask

TOKEN_TOLERANCE = 0.02


def failed_sentence(failed: list[dict]) -> str:
    """'every request failed (12 x http_400: Invalid request)' (the most common error)."""
    kinds: dict[str, int] = {}
    example: dict[str, str] = {}
    for r in failed:
        k = str(r.get("error_kind"))
        kinds[k] = kinds.get(k, 0) + 1
        example.setdefault(k, str(r.get("error_message") or "")[:200])
    top = max(kinds, key=lambda k: kinds[k])
    more = f", and {len(failed) - kinds[top]} other errors" if len(kinds) > 1 else ""
    return (f"every request failed ({kinds[top]} x {top}: {example[top] or 'no error text'}"
            f"{more})")


def failed_levels(requests: pd.DataFrame) -> list[str]:
    """One sentence per concurrency where no measured request succeeded."""
    if requests.empty:
        return []
    out = []
    m = requests[~requests["warmup"].astype(bool)]
    for conc, g in m.groupby("concurrency", sort=True):
        failed = g[~cancelled_mask(g)]  # cancelled on purpose (--cancel): no failure
        if len(failed) and not g["ok"].astype(bool).any():
            out.append(f"c={int(conc)}: {failed_sentence(failed.to_dict('records'))}; this level "
                       "has no latency or throughput figures.")
    return out


def _num(v: Any) -> float | None:
    return None if v is None or pd.isna(v) else float(v)


def _pct(diff: float, base: float) -> float:
    return 100.0 * diff / base if base else 0.0


@dataclass
class TokenCheck:
    endpoint: str
    overhead: float | None  # chat template overhead (None: unknown, the server reported none)
    rows: list[dict] = field(default_factory=list)

    @property
    def flagged(self) -> list[dict]:
        return [r for r in self.rows if r["prompt_flag"] or r["completion_flag"]]

    def sentences(self) -> list[str]:
        out = []
        if self.endpoint == "chat":
            out.append(
                f"chat template overhead: {self.overhead:g} prompt tokens per request (the "
                "server's usage.prompt_tokens minus ISL, median over requests)"
                if self.overhead is not None else
                "chat template overhead: unknown (the server reported no prompt tokens)")
        measured = [r for r in self.rows if r["isl_requested"] is not None]
        if measured and all(r["prompt_reported"] is None for r in measured):
            out.append("the server reported no usage: its prompt tokens are unknown, and output "
                       "tokens were counted from the stream's content events")
        reported = [r for r in measured if r["prompt_reported"] is not None]
        if reported and not self.flagged:
            over = " (plus the template overhead)" if self.overhead else ""
            out.append(f"server-reported prompt tokens within {100 * TOKEN_TOLERANCE:g}% of ISL"
                       f"{over} and completion tokens within {100 * TOKEN_TOLERANCE:g}% of OSL "
                       "at every level")
        for r in self.flagged:
            parts = []
            if r["prompt_flag"]:
                over = f" + {self.overhead:g} template" if self.overhead else ""
                parts.append(f"the server counted {r['prompt_reported']:.1f} prompt tokens for "
                             f"ISL {r['isl_requested']:.1f}{over} ({r['prompt_diff_pct']:+.1f}%)")
            if r["completion_flag"]:
                parts.append(f"{r['completion_reported']:.1f} completion tokens for OSL "
                             f"{r['osl_requested']:.1f} ({r['completion_diff_pct']:+.1f}%)")
            out.append(f"**c={r['concurrency']}: {'; '.join(parts)}: more than "
                       f"{100 * TOKEN_TOLERANCE:g}% off** (prompts not built with the server's "
                       "tokenizer? try --tokenizer)" if r["prompt_flag"] else
                       f"**c={r['concurrency']}: {'; '.join(parts)}: more than "
                       f"{100 * TOKEN_TOLERANCE:g}% off**")
        return out


def token_check(requests: pd.DataFrame, table: pd.DataFrame, endpoint: str) -> TokenCheck | None:
    """Requested vs server-reported tokens per concurrency (`table`: by_concurrency rows)."""
    if table.empty or "isl_requested_mean" not in table:
        return None
    ok = requests[requests["ok"].astype(bool) & ~requests["warmup"].astype(bool)]
    usage = ok[ok.get("input_tokens_source") == "usage"] if "input_tokens_source" in ok else ok[:0]
    if endpoint == "chat":
        excess = (usage["input_tokens"].astype("float64")
                  - usage["isl_requested"].astype("float64")).dropna()
        overhead: float | None = float(excess.median()) if len(excess) else None
    else:
        overhead = 0.0
    check = TokenCheck(endpoint=endpoint, overhead=overhead)
    for _, r in table.iterrows():
        isl, prompt = _num(r.get("isl_requested_mean")), _num(r.get("prompt_tokens_reported_mean"))
        osl = _num(r.get("osl_requested_mean"))
        comp = _num(r.get("completion_tokens_reported_mean"))
        pdiff = (_pct(prompt - isl - (overhead or 0.0), isl)
                 if isl is not None and prompt is not None else None)
        cdiff = _pct(comp - osl, osl) if osl is not None and comp is not None else None
        check.rows.append({
            "concurrency": int(r["concurrency"]), "isl_requested": isl, "prompt_reported": prompt,
            "prompt_diff_pct": pdiff, "osl_requested": osl, "completion_reported": comp,
            "completion_diff_pct": cdiff,
            "prompt_flag": pdiff is not None and abs(pdiff) > 100 * TOKEN_TOLERANCE,
            "completion_flag": cdiff is not None and abs(cdiff) > 100 * TOKEN_TOLERANCE,
        })
    return check
