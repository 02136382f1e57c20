"""The lab's scheduler on a simulated clock under the closed loop Dynamo's offline replay uses
(`replay_concurrency`): `conc` requests in flight, a new one added the moment one finishes
(at that pass's end). Prompts are distinct random ids, so no prefix is shared.

`python -m tests.interop.closed_loop` prints the lab engine beside Dynamo's own engine (its
offline replay, run in the Dynamo venv), under both policies, at c=1/32/128 for ISL 136/OSL
128 and ISL 1024/OSL 64: simulated time on both sides, so the figures do not depend on the
machine's load.
"""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mocker.engine import EngineArgs, EngineRequest, Scheduler
from mocker.engine.tokens import token_deriver

#: Dynamo 1.6.1's `python -m dynamo.mocker` defaults, as `normalize_mocker_config()` gives them:
#: vLLM policy, block 64, 16384 blocks, 256 sequences, 8192 batched tokens, prefix caching and
#: chunked prefill on, the polynomial timing model
DYNAMO_MOCKER_DEFAULTS: dict[str, Any] = {"engine_type": "vllm"}
#: policy -> (the lab's engine args, Dynamo's `extra_engine_args`) of the same engine. Dynamo's
#: trtllm policy charges no decode step for the first token: the lab's trtllm default does.
POLICIES: dict[str, tuple[dict[str, Any], dict[str, Any] | None]] = {
    "vllm": (DYNAMO_MOCKER_DEFAULTS, None),
    "trtllm": ({"engine_type": "trtllm", "first_token_decode": False},
               {"engine": {"backend": "trtllm"}}),
}
WORKLOADS = ((136, 128), (1024, 64))
LEVELS = (1, 32, 128)
REPLAY = Path(__file__).with_name("dynamo_replay.py")


@dataclass(frozen=True)
class Summary:
    median_ttft_ms: float
    mean_ttft_ms: float
    median_tpot_ms: float  # per request: (last - first) / (tokens - 1); median over requests
    duration_ms: float


def requests_for(conc: int) -> int:
    return max(64, 8 * conc)


def lab_closed_loop(isl: int, osl: int, conc: int, n: int,
                    engine_args: dict[str, Any] | None = None, *,
                    turnaround_ms: float = 0.0, warmup: int = 0) -> Summary:
    """`turnaround_ms`: a finished request's successor reaches the engine this long after the
    pass that finished it ended (0: in time for the next pass, as Dynamo's replay adds it).
    `warmup`: the first requests, left out of the summary."""
    sched = Scheduler(EngineArgs.from_json(dict(engine_args or DYNAMO_MOCKER_DEFAULTS)))
    rng = random.Random(1)
    arrived: dict[str, float] = {}
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    tokens: dict[str, int] = {}
    due: list[float] = []  # arrival times of successors not yet at the engine, in order

    def add(now: float) -> None:
        key = f"r{len(arrived)}"
        prompt = [rng.randrange(1, 1 << 30) for _ in range(isl)]
        sched.add(EngineRequest(key, prompt, osl, token_deriver(42, key)))
        arrived[key] = now

    now = 0.0
    for _ in range(min(conc, n)):
        add(now)
    while due or sched.has_work(now):
        while due and due[0] <= now:
            add(due.pop(0))
        if not sched.has_work(now):
            now = due[0]  # idle until the next successor arrives
            continue
        res = sched.step(now)
        now += res.duration_ms
        for sig in res.signals:
            first.setdefault(sig.key, now)
            last[sig.key] = now
            tokens[sig.key] = tokens.get(sig.key, 0) + 1
            if sig.completed and len(arrived) + len(due) < n:
                if turnaround_ms > 0.0:
                    due.append(now + turnaround_ms)
                else:
                    add(now)
    keys = [k for k in first if int(k[1:]) >= warmup]
    ttft = [first[k] - arrived[k] for k in keys]
    tpot = [(last[k] - first[k]) / (tokens[k] - 1) for k in keys if tokens[k] > 1]
    return Summary(statistics.median(ttft), statistics.mean(ttft), statistics.median(tpot), now)


def dynamo_closed_loop(python: Path, isl: int, osl: int, conc: int, n: int,
                       engine_args: dict[str, Any] | None = None) -> Summary:
    argv = [str(python), str(REPLAY), str(isl), str(osl), str(conc), str(n)]
    if engine_args is not None:
        argv.append(json.dumps(engine_args))
    res = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {res.stderr.strip()[-2000:]}")
    s = json.loads(res.stdout.strip().splitlines()[-1])
    return Summary(s["median_ttft_ms"], s["mean_ttft_ms"], s["median_tpot_ms"], s["duration_ms"])


def gap(lab: float, ref: float) -> float:
    return (lab - ref) / ref


def main() -> None:
    from tests.interop.dynamo_stack import python

    print("| policy | ISL/OSL | conc | metric | Dynamo engine | lab engine | gap |")
    print("|---|---|---|---|---|---|---|")
    for policy, (lab_args, dyn_args) in POLICIES.items():
        for isl, osl in WORKLOADS:
            for conc in LEVELS:
                n = requests_for(conc)
                dyn = dynamo_closed_loop(python(), isl, osl, conc, n, dyn_args)
                lab = lab_closed_loop(isl, osl, conc, n, lab_args)
                for name in ("median_ttft_ms", "mean_ttft_ms", "median_tpot_ms", "duration_ms"):
                    d, m = getattr(dyn, name), getattr(lab, name)
                    print(f"| {policy} | {isl}/{osl} | {conc} | {name} | {d:.2f} | {m:.2f} | "
                          f"{100 * gap(m, d):+.2f}% |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
