"""The report's "Prompt and completion tokens" section (lab.analysis.checks.TokenCheck)."""

from __future__ import annotations

from lab.analysis.checks import TOKEN_TOLERANCE, TokenCheck
from lab.report.markdown import fnum, md_table


def tokens_markdown(check: TokenCheck) -> str:
    """Per level: requested vs server-reported prompt and completion tokens, flags, overhead."""
    header = ["Conc", "ISL requested", "prompt tokens (server)", "diff", "OSL requested",
              "completion tokens (server)", "diff", ""]
    flag = f"**> {100 * TOKEN_TOLERANCE:g}% off**"
    rows = []
    for r in check.rows:
        rows.append([
            str(r["concurrency"]), fnum(r["isl_requested"]), fnum(r["prompt_reported"]),
            "-" if r["prompt_diff_pct"] is None else f"{r['prompt_diff_pct']:+.1f}%",
            fnum(r["osl_requested"]), fnum(r["completion_reported"]),
            "-" if r["completion_diff_pct"] is None else f"{r['completion_diff_pct']:+.1f}%",
            flag if r["prompt_flag"] or r["completion_flag"] else "",
        ])
    minus = " minus the template overhead" if check.overhead else ""
    note = (f"diff: server minus requested{minus}, in % of requested; flagged beyond "
            f"{100 * TOKEN_TOLERANCE:g}%.")
    lines = [md_table(header, rows), "", note]
    sentences = check.sentences()
    if sentences:
        lines += ["", *[f"- {s}" for s in sentences]]
    return "\n".join(lines)
