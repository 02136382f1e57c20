"""What building a counted level's prompts costs the client, before its first send:
`python -m tests.load.prompt_build_cost --tokenizer DIR [--isl N] [--n N] [--rounds R]`.

Alternating rounds of the level's prebuild (on `PREBUILD_THREADS` threads when its prompts
are slow to build) and of the same payloads built one by one (as a timed level builds each
before its send); prints seconds per level and milliseconds per prompt, medians over the
rounds, and checks that both give the same bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import statistics
import time

from lab.load.client import PREBUILD_THREADS, _Payloads
from lab.load.workload import RequestSet, WorkloadSpec


def _digest(payloads: list) -> str:
    return hashlib.sha256(b"".join(p[0] for p in payloads)).hexdigest()[:12]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", required=True, help="a tokenizer.json or model directory")
    ap.add_argument("--isl", type=int, default=4096)
    ap.add_argument("--n", type=int, default=576, help="prompts per level")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    spec = WorkloadSpec(isl=args.isl, osl=4, prompt_kind="text", tokenizer=args.tokenizer)
    times: dict[str, list[float]] = {"prebuild": [], "one by one": []}
    for r in range(args.rounds):
        requests = RequestSet(spec, "m", level_seed=r, n=args.n)
        requests[0]  # the tokenizer loads outside the timing
        t = time.perf_counter()
        prebuilt = _Payloads(requests)
        asyncio.run(prebuilt.prebuild(None))
        built = prebuilt.cache or []
        times["prebuild"].append(time.perf_counter() - t)
        lone = _Payloads(requests)
        t = time.perf_counter()
        one_by_one = [lone.get(i) for i in range(args.n)]
        times["one by one"].append(time.perf_counter() - t)
        if _digest(built) != _digest(one_by_one):
            raise SystemExit(f"round {r}: the prebuild's payloads differ from one-by-one builds")
    print(f"{args.n} prompts of {args.isl} tokens, {args.rounds} rounds, "
          f"{PREBUILD_THREADS} prebuild threads")
    for name, values in times.items():
        s = statistics.median(values)
        print(f"  {name:11} {s:6.2f} s  ({s / args.n * 1e3:.2f} ms/prompt; "
              f"rounds {', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
