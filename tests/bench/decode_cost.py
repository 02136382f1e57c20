"""What one streamed chunk costs the frontend's detokenizer: `python -m tests.bench.decode_cost`.

Runs a tokenizer's stream decoder (`HFTokenizer.stream_decoder()`, the one the frontend uses
per stream) over `--tokens` random ids of its vocabulary, one id per step as the engine streams
them at speedup 1, and prints the best of `--rounds` rounds in us per step, with the share of
ids whose bytes are ASCII. The figures: docs/measurements.md
"The detokenizer's step".
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

from lab.serve.tokenizer import HFTokenizer


def step_cost_us(tok: HFTokenizer, chunks: list[list[int]], rounds: int) -> float:
    """Best of `rounds` passes over `chunks` with a fresh stream decoder, in us per step."""
    best = float("inf")
    for _ in range(rounds):
        decoder = tok.stream_decoder()
        step = decoder.step
        t0 = time.perf_counter()
        for chunk in chunks:
            step(chunk)
        decoder.flush()
        best = min(best, time.perf_counter() - t0)
    return best / len(chunks) * 1e6


def count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", type=Path, required=True,
                    help="a model dir with tokenizer.json, or the file itself")
    ap.add_argument("--tokens", type=count, default=20_000, help="steps per round")
    ap.add_argument("--rounds", type=count, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    try:
        tok = HFTokenizer(args.tokenizer)
    except ValueError as exc:
        ap.error(str(exc))
    vocab = tok.vocab_size
    rng = random.Random(args.seed)
    chunks = [[rng.randrange(vocab)] for _ in range(args.tokens)]
    ascii_share = sum(tok.decode(c).isascii() for c in chunks) / len(chunks)
    cost = step_cost_us(tok, chunks, args.rounds)
    print(f"{type(tok.stream_decoder()).__name__}: {cost:.3f} us per one-id step "
          f"({args.tokens} steps, best of {args.rounds}; {100 * ascii_share:.1f}% of ids ASCII)")


if __name__ == "__main__":
    main()
