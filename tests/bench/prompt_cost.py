"""What a prompt token costs each process of the lab's path: `python -m tests.bench.prompt_cost`.

Launches a lab stack (the HuggingFace tokenizer given, an engine of fixed timing), sends
`--requests` sequential streamed text prompts of each ISL, OSL 4, and prints per process
(frontend, sidecar, engine) the CPU time per request (all threads, from
/proc/PID/task/*/schedstat, so the figure holds on a loaded machine better than wall clock)
and its slope per prompt token between the smallest and the largest ISL, plus the client's
TTFT p50. Why: docs/token-path.md "The lab path's per-prompt-token cost"; the figures:
docs/measurements.md "The lab path's per-prompt-token cost".

With `--burst N` it sends instead 4 waves of N prompts of the first ISL at once (OSL 128),
each when the last ended, and prints each wave's TTFTs sorted: the steps are the engine's
passes (docs/fidelity.md "TTFT at c=32: waves, and the pass a wave misses"); `--engine-args`
sets the engine (e.g. '{"engine_type": "vllm"}', Dynamo's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psutil

from lab.fidelity.lab_stack import lab_spec
from lab.load.corpus import exact_text
from lab.shared.hf_tokenizer import load_hf
from launch.stack import Stack

FIXED = {"engine_type": "trtllm", "first_token_decode": False,
         "timing": {"type": "fixed", "prefill_ms": 2.0, "decode_ms": 1.0}}
OSL = 4


def _cpu(pids: dict[str, psutil.Process]) -> dict[str, float]:
    """CPU seconds of each process, all threads, from /proc/PID/task/*/schedstat (ns; the
    tick-granular user + system times are too coarse for a request of a few ms)."""
    out = {}
    for name, p in pids.items():
        total = 0
        for task in Path(f"/proc/{p.pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (FileNotFoundError, ProcessLookupError):
                continue  # a thread that ended meanwhile
        out[name] = total / 1e9
    return out


async def _one(session: aiohttp.ClientSession, url: str, model: str, text: str,
               osl: int = OSL) -> float:
    body = {"model": model, "prompt": text, "max_tokens": osl, "min_tokens": osl,
            "ignore_eos": True, "stream": True}
    t0 = time.perf_counter()
    ttft = -1.0
    async with session.post(url + "/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.content:
            if ttft < 0 and line.startswith(b"data: {"):
                ttft = (time.perf_counter() - t0) * 1000.0
    return ttft


async def burst(tokenizer: str, isl: int, n: int, engine_args: str) -> None:
    tok = load_hf(tokenizer)
    spec = lab_spec(speedup=1.0, tokenizer=tokenizer, name="burst", engine_args=engine_args)
    with tempfile.TemporaryDirectory(prefix="prompt-burst-") as tmp:
        async with (Stack(spec, Path(tmp) / "stack") as stack,
                    aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session):
            for wave in range(4):
                rng = random.Random(f"prompt-burst/{wave}")
                texts = [exact_text(tok, isl, rng) for _ in range(n)]
                ttfts = sorted(await asyncio.gather(*[
                    _one(session, stack.frontend_url, stack.model, t, 128) for t in texts]))
                print(f"wave {wave}: TTFT p50 {statistics.median(ttfts):.1f} ms, sorted "
                      + " ".join(f"{x:.0f}" for x in ttfts), flush=True)


async def run(tokenizer: str, isls: list[int], n: int) -> list[dict]:
    tok = load_hf(tokenizer)
    spec = lab_spec(speedup=1.0, tokenizer=tokenizer, name="prompt-cost",
                    engine_args=json.dumps(FIXED))
    rows = []
    with tempfile.TemporaryDirectory(prefix="prompt-cost-") as tmp:
        async with Stack(spec, Path(tmp) / "stack") as stack:
            procs = {v.role: psutil.Process(v.pid) for v in stack.processes() if v.pid}
            url, model = stack.frontend_url, stack.model
            async with aiohttp.ClientSession() as session:
                for isl in isls:
                    rng = random.Random(f"prompt-cost/{isl}")
                    texts = [exact_text(tok, isl, rng) for _ in range(n + 3)]
                    for t in texts[:3]:  # warm-up
                        await _one(session, url, model, t)
                    before = _cpu(procs)
                    ttfts = [await _one(session, url, model, t) for t in texts[3:]]
                    after = _cpu(procs)
                    rows.append({"isl": isl, "ttft_ms_p50": statistics.median(ttfts),
                                 **{k: (after[k] - before[k]) / n * 1000.0 for k in procs}})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", required=True, help="a HuggingFace tokenizer dir/file")
    ap.add_argument("--isl", default="64,1024,4096", help="comma-separated prompt lengths")
    ap.add_argument("--requests", type=int, default=40, help="measured requests per ISL")
    ap.add_argument("--burst", type=int, default=0, help="waves of this many prompts at once")
    ap.add_argument("--engine-args", default=json.dumps({"engine_type": "vllm"}),
                    help="the engine of --burst (JSON)")
    a = ap.parse_args(argv)
    isls = [int(x) for x in a.isl.split(",")]
    if a.burst:
        asyncio.run(burst(a.tokenizer, isls[0], a.burst, a.engine_args))
        return
    rows = asyncio.run(run(a.tokenizer, isls, a.requests))
    names = [k for k in rows[0] if k not in ("isl", "ttft_ms_p50")]
    print("ISL    TTFT p50 ms  " + "  ".join(f"{k} CPU ms/req" for k in names))
    for r in rows:
        print(f"{r['isl']:<6} {r['ttft_ms_p50']:>11.2f}  "
              + "  ".join(f"{r[k]:>{len(k) + 12}.3f}" for k in names))
    lo, hi = rows[0], rows[-1]
    span = hi["isl"] - lo["isl"]
    if span > 0:
        print(f"per prompt token ({lo['isl']} -> {hi['isl']}), us: "
              + ", ".join(f"{k} {(hi[k] - lo[k]) / span * 1000.0:.3f}" for k in names)
              + f", TTFT {(hi['ttft_ms_p50'] - lo['ttft_ms_p50']) / span * 1000.0:.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
