"""Benchmark the load client's scheduling beside a server on the same machine: `lab sweep
--target URL` in alternating rounds, the client at normal priority and with --client-realtime
(SCHED_RR), and per run the client's loop lag and the figures it stamped:

    python -m tests.bench.bench_client_priority --target http://127.0.0.1:8901 \\
        --model tiny-llama --tokenizer $ANCHOR_DIR/model

(vLLM on the CPU: `$ANCHORS/vllm.sh up`). Each run sends prompts of its own seed, so that a
prefix cache serves none of them. Needs root or CAP_SYS_NICE for the real-time runs
(docs/fidelity.md "The client's scheduling").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

LAB = str(Path(sys.executable).parent / "lab")
MODES = {"normal": (), "realtime": ("--client-realtime",)}


def run(args: argparse.Namespace, out: Path, mode: str, seed: int) -> list[dict]:
    cmd = [LAB, "sweep", "--target", args.target, "--model", args.model, "--isl", str(args.isl),
           "--osl", str(args.osl), "--conc", args.conc, "--requests", str(args.requests),
           "--seed", str(seed), "--no-plots", "--quiet", "--out", str(out), *MODES[mode]]
    if args.tokenizer:
        cmd += ["--tokenizer", args.tokenizer, "--prompt-kind", "text"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{mode} run failed:\n{proc.stdout}{proc.stderr}")
    health = json.loads((out / "client.json").read_text())
    rows = []
    for level in json.loads((out / "levels.json").read_text()):
        h = health[f"{level['concurrency']}/{level['repeat']}"]
        rows.append({"mode": mode, "c": level["concurrency"], "sched": h["scheduling"],
                     "lag_max": h["loop_lag_max_ms"], "ttft_p50": level["ttft_ms_p50"],
                     "ttft_p99": level["ttft_ms_p99"], "itl_p50": level["itl_ms_p50"],
                     "req_s": level["req_s"]})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--tokenizer", help="the target's tokenizer (text prompts), if any")
    p.add_argument("--isl", type=int, default=512)
    p.add_argument("--osl", type=int, default=64)
    p.add_argument("--conc", default="1,32")
    p.add_argument("--requests", type=int, default=96)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=960)
    args = p.parse_args()
    print("| round | client | c | scheduling | loop lag max ms | TTFT p50 ms | TTFT p99 ms "
          "| ITL p50 ms | req/s |\n|---|---|---|---|---|---|---|---|---|", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-priority-") as tmp:
        for k in range(1, args.rounds + 1):
            order = list(MODES) if k % 2 else list(reversed(MODES))
            for i, mode in enumerate(order):
                seed = args.seed + 10 * k + i
                for r in run(args, Path(tmp) / f"{mode}-{k}", mode, seed):
                    print(f"| {k} | {r['mode']} | {r['c']} | {r['sched']} | {r['lag_max']:.0f} "
                          f"| {r['ttft_p50']:.1f} | {r['ttft_p99']:.1f} | {r['itl_p50']:.2f} "
                          f"| {r['req_s']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
