"""Trace replay: requests sent at a trace's times, with prompts whose shared blocks are shared.

The trace format is mooncake's JSONL, one request a line:
`{"timestamp": MS, "input_length": N, "output_length": M, "hash_ids": [...]}`. `timestamp` is
milliseconds since the trace's start; `hash_ids[k]` names the content of the prompt's k-th block
of `block_size` tokens (mooncake: 512), and the same id means the same tokens, so the prefix
cache hits as the trace says. The last block may be partial (input_length is not a multiple of
the block size); tokens beyond the listed blocks are the request's own.

A block's tokens are a seeded function of (seed, hash id): equal ids are equal token ids
(exact in any tokenizer, since ids are what is sent; within the --tokenizer's vocabulary when
given), and a partial last block is the first tokens of its full block. Request i is due
`(timestamp_i - timestamp_0) / speed` after the level's start, through the same open-loop
scheduler as `--rate` (`lab.open_loop.client`), which records intended and actual sends.

`expected_cached_tokens` is the prefix reuse the trace itself implies: per request, the tokens
of its leading blocks that an earlier request already had (a prefix cache's hit, given room).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from lab.load.workload import (
    TOKEN_ID_MAX,
    TOKEN_ID_MIN,
    LazyRequests,
    ids_to_words,
    request_body,
)

#: mooncake's block size, in tokens: what one hash id covers.
MOONCAKE_BLOCK_SIZE = 512
NS_PER_MS = 1_000_000
_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


class TraceError(ValueError):
    """A trace file that cannot be replayed; the message names the file and line."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One line of a trace."""

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        ts: float | int = int(self.timestamp_ms) if self.timestamp_ms.is_integer() else \
            self.timestamp_ms
        return {"timestamp": ts, "input_length": self.input_length,
                "output_length": self.output_length, "hash_ids": list(self.hash_ids)}


def _count(value: Any, name: str, where: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TraceError(f"{where}: {name} must be an integer >= {minimum} (got {value!r})")
    return value


def parse_line(text: str, where: str, block_size: int) -> TraceRequest:
    """One JSONL line as a TraceRequest; TraceError naming `where` (FILE:LINE) otherwise."""
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise TraceError(f"{where}: not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: expected a JSON object with {', '.join(_FIELDS)}")
    missing = [f for f in _FIELDS if f not in obj]
    if missing:
        raise TraceError(f"{where}: missing {', '.join(missing)}")
    ts = obj["timestamp"]
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts) or ts < 0:
        raise TraceError(f"{where}: timestamp must be a finite number of ms >= 0 (got {ts!r})")
    isl = _count(obj["input_length"], "input_length", where, 1)
    osl = _count(obj["output_length"], "output_length", where, 1)
    ids = obj["hash_ids"]
    if not isinstance(ids, list):
        raise TraceError(f"{where}: hash_ids must be a list of integers")
    for h in ids:
        _count(h, "every hash id", where, 0)
    if (len(ids) - 1) * block_size >= isl and ids:
        raise TraceError(f"{where}: {len(ids)} hash_ids of {block_size} tokens are more blocks "
                         f"than input_length {isl} needs (a different --trace-block-size?)")
    return TraceRequest(float(ts), isl, osl, tuple(ids))


def read_trace(path: Path, block_size: int = MOONCAKE_BLOCK_SIZE) -> list[TraceRequest]:
    """Every request of a trace file, in order; timestamps must not go back."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read the trace: {exc}") from None
    out: list[TraceRequest] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        req = parse_line(line, f"{path}:{n}", block_size)
        if out and req.timestamp_ms < out[-1].timestamp_ms:
            raise TraceError(f"{path}:{n}: timestamp {req.timestamp_ms:g} ms is before the "
                             f"previous line's {out[-1].timestamp_ms:g} ms (a trace is in "
                             "send order)")
        out.append(req)
    if not out:
        raise TraceError(f"{path}: the trace has no requests")
    return out


def write_trace(path: Path, requests: Sequence[TraceRequest]) -> None:
    Path(path).write_bytes(b"".join(orjson.dumps(r.to_json()) + b"\n" for r in requests))


def offsets_ns(requests: Sequence[TraceRequest], speed: float = 1.0) -> np.ndarray:
    """Each request's intended send time from the first's, in ns, at `speed` x the trace's."""
    ts = np.array([r.timestamp_ms for r in requests], dtype=np.float64)
    return np.round((ts - ts[0]) * NS_PER_MS / speed).astype(np.int64)


def offered_rate(requests: Sequence[TraceRequest], speed: float = 1.0) -> float:
    """The trace's mean request rate (req/s) at `speed`: (n - 1) / span (n / 1 s for one)."""
    span_s = (requests[-1].timestamp_ms - requests[0].timestamp_ms) / 1000 / speed
    return (len(requests) - 1) / span_s if span_s > 0 else float(len(requests))


def block_lengths(req: TraceRequest, block_size: int) -> list[int]:
    """Tokens of each of the request's hash blocks (the last may be partial)."""
    return [min(block_size, req.input_length - k * block_size) for k in range(len(req.hash_ids))]


def expected_cached_tokens(requests: Sequence[TraceRequest], block_size: int) -> list[int]:
    """Per request, the tokens of its leading blocks an earlier request already sent (full
    blocks only: a cache keeps whole blocks), capped at input_length - 1 (the last prompt token
    is always computed)."""
    seen: set[tuple[int, ...]] = set()
    out = []
    for req in requests:
        hit = 0
        lengths = block_lengths(req, block_size)
        for k in range(len(req.hash_ids)):
            prefix = req.hash_ids[:k + 1]
            if prefix not in seen or lengths[k] < block_size:
                break
            hit += lengths[k]
        for k in range(len(req.hash_ids)):
            if lengths[k] == block_size:
                seen.add(req.hash_ids[:k + 1])
        out.append(min(hit, req.input_length - 1))
    return out


class TracePrompts:
    """The token ids of a trace's prompts: block `h` is the same ids wherever it appears."""

    def __init__(self, block_size: int, seed: int, id_max: int = TOKEN_ID_MAX) -> None:
        self.block_size = block_size
        self.seed = seed
        self.id_max = id_max
        self._blocks: dict[int, list[int]] = {}

    def block(self, h: int) -> list[int]:
        ids = self._blocks.get(h)
        if ids is None:
            rng = random.Random(f"trace-block/{self.seed}/{h}")
            ids = [rng.randint(TOKEN_ID_MIN, self.id_max) for _ in range(self.block_size)]
            self._blocks[h] = ids
        return ids

    def prompt(self, req: TraceRequest, index: int) -> list[int]:
        ids: list[int] = []
        for h, n in zip(req.hash_ids, block_lengths(req, self.block_size), strict=True):
            ids.extend(self.block(h)[:n])
        rest = req.input_length - len(ids)
        if rest > 0:
            rng = random.Random(f"trace-own/{self.seed}/{index}")
            ids.extend(rng.randint(TOKEN_ID_MIN, self.id_max) for _ in range(rest))
        return ids


class TraceRequestSet(LazyRequests):
    """A trace's request bodies (built on access, picklable): exactly input_length prompt
    tokens (token ids; `<token:N>` words on the chat endpoint) and output_length output tokens.
    """

    def __init__(self, requests: Sequence[TraceRequest], model: str, *, block_size: int,
                 seed: int, endpoint: str = "completions", stream: bool = True,
                 include_usage: bool = True, id_max: int = TOKEN_ID_MAX) -> None:
        self.requests = list(requests)
        self.model = model
        self.endpoint = endpoint
        self.stream = stream
        self.include_usage = include_usage
        self.prompts = TracePrompts(block_size, seed, id_max)

    def __len__(self) -> int:
        return len(self.requests)

    def body(self, i: int) -> dict:
        req = self.requests[i]
        ids = self.prompts.prompt(req, i)
        prompt: str | list[int] = ids_to_words(ids) if self.endpoint == "chat" else ids
        return request_body(self.model, self.endpoint, prompt, req.output_length,
                            stream=self.stream, include_usage=self.include_usage)

    def requested(self, i: int) -> tuple[int, int]:
        """(prompt tokens, output tokens) of request `i`: the trace's lengths."""
        req = self.requests[i]
        return req.input_length, req.output_length

