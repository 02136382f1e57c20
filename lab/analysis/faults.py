"""What a sweep lost to an injected fault, from requests.parquet and the launcher's events.jsonl
(both on the perf_counter_ns clock): when the fault hit, when the worker left discovery, when its
sidecar exited, when it was back and registered, how many requests failed and of which kinds,
and whether any request on another worker failed.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import pandas as pd

from lab.analysis.metrics import format_errors

#: Kinds that end a fault: their outcome is when the worker was back in rotation.
RESUME_KINDS = frozenset({"unfreeze", "cont", "serving"})
#: How long after a withdrawal the frontend may still route to the worker (its discovery poll).
WATCH_SLACK_S = 0.5

_WORKER_IN_MESSAGE = re.compile(r"\(worker ([A-Za-z0-9_.:-]+)\)")


def request_workers(requests: pd.DataFrame) -> pd.Series:
    """The worker a request ran on: its decode worker id, else the one its error names
    (the frontend's errors end with "(worker <id>)"), else None."""
    named = requests["error_message"].astype("string").str.extract(_WORKER_IN_MESSAGE)[0]
    return requests["decode_worker_id"].astype("string").fillna(named)


def worker_of(process: str) -> str | None:
    """The discovery worker a process's fault hits: engine-decode-0 -> sidecar-decode-0."""
    if process.startswith("engine"):
        return "sidecar" + process[len("engine"):]
    if process.startswith("sidecar"):
        return process
    return None


@dataclass
class FaultOutcome:
    process: str
    kind: str
    t_ns: int
    worker: str | None
    withdrawn_ns: int | None = None
    sidecar_exit_ns: int | None = None
    sidecar_exit_code: int | None = None
    engine_exit_ns: int | None = None
    restarted_ns: int | None = None
    registered_ns: int | None = None
    failed: dict[str, int] = field(default_factory=dict)
    failed_other_worker: int = 0
    failed_unattributed: int = 0
    ok_other_worker_during: int = 0
    failed_before: int = 0
    moved: int = 0  # requests that failed on the worker and finished on another one
    moved_to: dict[str, int] = field(default_factory=dict)
    reached_while_out: int = 0  # requests sent to the worker while it was out of rotation

    @property
    def resume(self) -> bool:
        return self.kind in RESUME_KINDS


@dataclass
class FaultAnalysis:
    t0_ns: int  # first request sent in the run
    outcomes: list[FaultOutcome]
    total_failed: int

    def _rel(self, t: int | None) -> str:
        return "-" if t is None else f"{(t - self.t0_ns) / 1e9:.2f} s"

    def fault_marks(self) -> list[dict]:
        return [{"t_ns": o.t_ns, "label": f"{o.kind} {o.process}"} for o in self.outcomes]

    def worker_marks(self) -> list[dict]:
        marks = []
        for o in self.outcomes:
            for t, what in ((o.withdrawn_ns, "left discovery"), (o.sidecar_exit_ns, "sidecar exit"),
                            (o.registered_ns, "registered again")):
                if t is not None:
                    marks.append({"t_ns": t, "label": f"{o.worker} {what}"})
        return marks

    def markdown(self) -> str:
        header = ["fault", "at", "left discovery", "sidecar exited", "back and registered",
                  "failed requests", "moved to another worker", "failed on other workers"]
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for o in self.outcomes:
            exit_txt = self._rel(o.sidecar_exit_ns)
            if o.sidecar_exit_code is not None:
                exit_txt += f" (code {o.sidecar_exit_code})"
            lines.append("| " + " | ".join([
                f"{o.kind} {o.process}", self._rel(o.t_ns), self._rel(o.withdrawn_ns), exit_txt,
                self._rel(o.registered_ns), format_errors(o.failed), _moved(o),
                str(o.failed_other_worker),
            ]) + " |")
        text = ["Times are seconds since the sweep's first request.", "", "\n".join(lines), ""]
        for o in self.outcomes:
            sentence = [f"`{o.kind}` on {o.process} at {self._rel(o.t_ns)}:"]
            if o.resume:
                if o.registered_ns is not None:
                    sentence.append(f"{o.worker} was back in rotation "
                                    f"{(o.registered_ns - o.t_ns) / 1e6:.0f} ms later.")
                elif o.worker:
                    sentence.append(f"{o.worker} was not back in rotation within the run.")
                text.append(" ".join(sentence))
                text.append("")
                continue
            if o.withdrawn_ns is not None:
                sentence.append(f"{o.worker} left discovery "
                                f"{(o.withdrawn_ns - o.t_ns) / 1e6:.0f} ms later;")
            elif o.worker:
                sentence.append(f"{o.worker} never left discovery;")
            if o.registered_ns is not None:
                sentence.append(f"it was back and registered after "
                                f"{(o.registered_ns - o.t_ns) / 1e9:.1f} s;")
            elif o.worker:
                sentence.append("it did not register again within the run;")
            n_failed = sum(o.failed.values())
            kinds = format_errors(o.failed)
            kinds = kinds[kinds.index("(") + 1:-1] if "(" in kinds else "none"
            sentence.append(f"{n_failed} requests failed after the fault ({kinds})")
            if o.moved:
                to = ", ".join(f"to {w}: {n}" for w, n in sorted(o.moved_to.items()))
                sentence.append(f"and {o.moved} moved to another worker ({to})")
            if o.failed_unattributed:
                sentence.append(f"({o.failed_unattributed} of them name no worker)")
            if o.failed_other_worker == 0:
                sentence.append(f"and none on another worker ({o.ok_other_worker_during} requests "
                                "on other workers succeeded meanwhile).")
            else:
                sentence.append(f"of which {o.failed_other_worker} on another worker.")
            if o.withdrawn_ns is not None:
                sentence.append(f"{o.reached_while_out} requests were sent to {o.worker} while "
                                f"it was out of rotation (from {WATCH_SLACK_S:g} s after it "
                                "left discovery).")
            text.append(" ".join(sentence))
            text.append("")
        return "\n".join(text).rstrip() + "\n"


def _moved(o: FaultOutcome) -> str:
    if not o.moved:
        return "0"
    return f"{o.moved} (" + ", ".join(f"to {w}: {n}" for w, n in sorted(o.moved_to.items())) + ")"


def _first(events: list[dict], kind: str, name: str | None, after: int) -> dict | None:
    for e in events:
        if e.get("event") == kind and e.get("name") == name and e.get("t_ns", 0) >= after:
            return e
    return None


def analyse_faults(requests: pd.DataFrame, events: list[dict]) -> FaultAnalysis:
    events = sorted(events, key=lambda e: e.get("t_ns", 0))
    faults = [e for e in events if e.get("event") == "fault"]
    t0 = int(requests["sent_ns"].min()) if len(requests) else (faults[0]["t_ns"] if faults else 0)
    done = requests["done_ns"].astype("float64").fillna(requests["sent_ns"].astype("float64"))
    failed_mask = ~requests["ok"].astype(bool)
    outcomes = []
    for i, f in enumerate(faults):
        t = int(f["t_ns"])
        nxt = int(faults[i + 1]["t_ns"]) if i + 1 < len(faults) else None
        worker = worker_of(str(f.get("name", "")))
        o = FaultOutcome(process=str(f.get("name")), kind=str(f.get("kind")), t_ns=t, worker=worker)
        if worker and o.resume:
            r = _first(events, "registered", worker, t)
            o.registered_ns = r["t_ns"] if r else None
        elif worker:
            w = _first(events, "withdrawn", worker, t)
            o.withdrawn_ns = w["t_ns"] if w else None
            x = _first(events, "exit", worker, t)
            if x:
                o.sidecar_exit_ns, o.sidecar_exit_code = x["t_ns"], x.get("code")
            r = _first(events, "registered", worker, o.withdrawn_ns or t)
            o.registered_ns = r["t_ns"] if r else None
        ex = _first(events, "exit", o.process, t)
        o.engine_exit_ns = ex["t_ns"] if ex else None
        rs = _first(events, "restart", o.process, t)
        o.restarted_ns = rs["t_ns"] if rs else None
        after = (done >= t) if nxt is None else ((done >= t) & (done < nxt))
        hit = requests[after & failed_mask]
        o.failed = dict(Counter(str(k) for k in hit["error_kind"]).most_common())
        if worker and "moved_from" in requests.columns:
            moved_from = requests["moved_from"].astype("string").fillna("")
            left = moved_from.str.split(",").apply(lambda ws, w=worker: w in ws)
            moved = requests[after & ~failed_mask & left]
            o.moved = len(moved)
            o.moved_to = dict(Counter(str(w) for w in moved["decode_worker_id"]).most_common())
            if o.withdrawn_ns is not None:
                # Sent after the frontend could have seen the withdrawal (its discovery poll),
                # before the worker was back: did any reach it?
                out_from = o.withdrawn_ns + int(WATCH_SLACK_S * 1e9)
                out_to = o.registered_ns or int(requests["sent_ns"].max()) + 1
                sent = requests["sent_ns"]
                reached = left | (requests["decode_worker_id"].astype("string") == worker)
                o.reached_while_out = int(
                    (reached.fillna(False) & (sent >= out_from) & (sent < out_to)).sum())
        if worker:
            ran_on = request_workers(requests)
            on_other = ran_on.notna() & (ran_on != worker)
            prefill = requests["prefill_worker_id"].astype("string")
            on_other &= prefill.isna() | (prefill != worker)
            end = o.registered_ns or (nxt if nxt is not None else int(done.max()))
            during = (done >= t) & (done <= end)
            o.failed_other_worker = int((after & failed_mask & on_other).sum())
            o.failed_unattributed = int((after & failed_mask & ran_on.isna()).sum())
            o.ok_other_worker_during = int((during & ~failed_mask & on_other).sum())
        o.failed_before = int(((done < t) & failed_mask).sum())
        outcomes.append(o)
    return FaultAnalysis(t0_ns=t0, outcomes=outcomes, total_failed=int(failed_mask.sum()))
