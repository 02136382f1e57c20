"""Pass timing models (docs/mocker.md "Timing"). All times in milliseconds.

Models (selected by `EngineArgs.timing["type"]`):

* ``polynomial`` (default): prefill on T = total new prompt tokens of the pass,
  ``4.209989e-07*T^2 + 1.518344e-02*T + 1.650142e+01`` (0 when T == 0); decode on
  p = active KV tokens / (num_gpu_blocks * block_size),
  ``-25.74*p^2 + 54.01*p + 5.74``, floored at 1 ms.
* ``linear``: a pass costs what is in it (docs/mocker.md "Timing"), each term a non-negative
  coefficient that `lab calibrate` fits (least squares) to a real engine:

  ``pass_ms + token_ms * (tokens computed) + seq_ms * (sequences in the pass)
  + kv_token_ms * (KV tokens the decode sequences attend to)
  + attention_mpair_ms * (prefill query-key pairs / 1e6)
  + prefill_pass_ms * (1 if the pass prefills anything)``

  where a prefill chunk of n tokens after c computed ones has ``n * (c + (n + 1) / 2)``
  query-key pairs (causal attention grows with the square of the prompt). With
  ``weight_bound_rows`` k, the tokens computed and the sequences count as at least k each: a
  small batch's matmuls are bound by reading the weights, so a decode step is nearly flat up
  to k sequences and grows with each one past it (vLLM on this machine: docs/fidelity.md). Optional
  ``request_ms`` + ``request_token_ms * prompt tokens`` is a per-request latency before the
  request may be scheduled (a target's serving path beyond the lab's own; it holds no pass),
  or with ``"request_mode": "floor"`` a first-token floor, as under ``profile``.
  Unlike ``polynomial`` and ``profile``, a decode step here depends on how many sequences
  share it, not only on the KV tokens they hold: a real engine's step does (per-sequence
  sampling, input preparation and output handling).
* ``fixed``: ``{"type": "fixed", "prefill_ms": X, "decode_ms": Y}``: constant per pass
  (prefill charged only when the pass has new prompt tokens; decode floored at 1 ms like the
  polynomial model).
* ``profile``: ``{"type": "profile", "path": "file.csv"}``: a CSV with the header
  ``kind,tokens,ms`` and one row per measured point:

  - ``kind = prefill``: ``tokens`` = total new prompt tokens of a pass, ``ms`` = prefill time;
  - ``kind = decode``: ``tokens`` = active KV tokens (sum of the sequence lengths of the
    decode-ready requests), ``ms`` = decode step time;
  - ``kind = request`` (optional): ``tokens`` = prompt tokens, ``ms`` = a per-request latency
    which holds no engine time (no other request waits for it): a target's HTTP and routing
    path beyond the lab's own, as `lab calibrate` measures it (docs/fidelity.md). Not applied
    to a decode leg after a handoff. ``"request_mode"`` says where it sits: ``delay``
    (default) before the request may be scheduled, but for ``"request_after_share"`` of it
    (0 to 1, default 0), by which its first token comes out after the pass that computed it;
    ``floor`` the request is scheduled at once and its first token is emitted no earlier than
    that latency after arrival.

  Each kind is a 1-D piecewise-linear interpolation over ``tokens`` with linear extrapolation
  past both ends (from the two nearest points; a single point is a constant); at least one row
  per kind is required. Prefill is 0 when T == 0; results are floored at 0 (prefill) and 1 ms
  (decode). Rows with the same ``tokens`` keep the last one. Blank lines and lines starting
  with ``#`` are ignored.

Modeled times are divided by ``speedup_ratio`` (prefill) and
``speedup_ratio * decode_speedup_ratio`` (decode); a zero ratio means 0 ms (no sleeping).
"""

from __future__ import annotations

import bisect
import csv
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import (
    LINEAR_TERMS,
    REQUEST_AFTER_SHARE,
    REQUEST_MODES,
    WEIGHT_BOUND_ROWS,
    EngineArgs,
)

PREFILL_A = 4.209989e-07
PREFILL_B = 1.518344e-02
PREFILL_C = 1.650142e01
DECODE_A = -25.74
DECODE_B = 54.01
DECODE_C = 5.74
DECODE_FLOOR_MS = 1.0
PROFILE_COLUMNS = ("kind", "tokens", "ms")


def prefill_pairs(chunk: int, context: int) -> float:
    """Causal attention's query-key pairs of a prefill chunk of `chunk` tokens that follows
    `context` already computed tokens (each new token attends to everything before it and to
    itself)."""
    return chunk * (context + (chunk + 1) / 2.0)


def pass_features(prefill_tokens: int, prefill_pairs_total: float, seqs: int, decode_seqs: int,
                  decode_kv: int, bound_rows: float = 0.0
                  ) -> tuple[float, float, float, float, float, float]:
    """What the ``linear`` model multiplies `LINEAR_PASS_TERMS` (mocker.engine.config) by, for
    one pass: 1, the tokens computed (prefill chunks plus one per decode sequence), the
    sequences scheduled (each of these two at least `bound_rows`, the model's
    ``weight_bound_rows``), the KV tokens the decode sequences attend to, the prefill
    query-key pairs in millions, and 1 when the pass prefills anything (a constant of a
    prefill pass, such as the 16.5 ms of Dynamo's polynomial prefill)."""
    return (1.0, max(float(prefill_tokens + decode_seqs), bound_rows),
            max(float(seqs), bound_rows), float(decode_kv), prefill_pairs_total / 1e6,
            1.0 if prefill_tokens else 0.0)


def polynomial_prefill_ms(new_tokens: int) -> float:
    """Unscaled prefill time of a pass with `new_tokens` new prompt tokens."""
    if new_tokens <= 0:
        return 0.0
    t = float(new_tokens)
    return PREFILL_A * t * t + PREFILL_B * t + PREFILL_C


def polynomial_decode_ms(p: float) -> float:
    """Unscaled decode time at active-KV fraction `p` (floored at 1 ms)."""
    ms = DECODE_A * p * p + DECODE_B * p + DECODE_C
    return ms if ms > DECODE_FLOOR_MS else DECODE_FLOOR_MS


class Interp1D:
    """Piecewise-linear interpolation with linear extrapolation at both ends."""

    __slots__ = ("xs", "ys")

    def __init__(self, points: list[tuple[float, float]]) -> None:
        if not points:
            raise ValueError("interpolation needs at least one point")
        dedup = dict(sorted(points, key=lambda p: p[0]))
        self.xs = list(dedup.keys())
        self.ys = list(dedup.values())

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        n = len(xs)
        if n == 1:
            return ys[0]
        i = bisect.bisect_left(xs, x)
        i = min(max(i, 1), n - 1)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def load_profile(path: str | Path) -> tuple[Interp1D, Interp1D, Interp1D | None]:
    """Read a profile CSV (see module docstring) into (prefill, decode, request)
    interpolators; request is None without request rows."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read timing profile {str(path)!r}: {exc}") from exc
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    reader = csv.DictReader(lines)
    if reader.fieldnames is None or [c.strip() for c in reader.fieldnames] != list(
        PROFILE_COLUMNS
    ):
        raise ValueError(
            f"timing profile {str(path)!r} must have the header {','.join(PROFILE_COLUMNS)}"
        )
    pts: dict[str, list[tuple[float, float]]] = {"prefill": [], "decode": [], "request": []}
    for n, row in enumerate(reader, start=2):
        kind = (row.get("kind") or "").strip()
        if kind not in pts:
            raise ValueError(
                f"timing profile {str(path)!r} line {n}: kind must be prefill, decode or "
                "request"
            )
        try:
            pts[kind].append((float(row["tokens"]), float(row["ms"])))
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"timing profile {str(path)!r} line {n}: tokens and ms must be numbers"
            ) from exc
    for kind in ("prefill", "decode"):
        if not pts[kind]:
            raise ValueError(f"timing profile {str(path)!r} has no {kind} rows")
    return (Interp1D(pts["prefill"]), Interp1D(pts["decode"]),
            Interp1D(pts["request"]) if pts["request"] else None)


@dataclass(frozen=True, slots=True)
class LinearPass:
    """The ``linear`` model's coefficients (ms; `LINEAR_TERMS`) and its `WEIGHT_BOUND_ROWS`,
    validated by `mocker.engine.config`."""

    pass_ms: float = 0.0
    token_ms: float = 0.0
    seq_ms: float = 0.0
    kv_token_ms: float = 0.0
    attention_mpair_ms: float = 0.0
    prefill_pass_ms: float = 0.0
    request_ms: float = 0.0
    request_token_ms: float = 0.0
    weight_bound_rows: float = 0.0

    @classmethod
    def from_timing(cls, timing: dict[str, Any]) -> LinearPass:
        return cls(**{name: float(timing.get(name, 0.0))
                      for name in (*LINEAR_TERMS, WEIGHT_BOUND_ROWS)})

    def pass_time_ms(self, prefill_tokens: int, pairs: float, seqs: int, decode_seqs: int,
                     decode_kv: int) -> float:
        """Unscaled time of one pass (the terms of `pass_features`)."""
        rows = self.weight_bound_rows
        tokens = prefill_tokens + decode_seqs
        ms = (self.pass_ms + self.token_ms * (tokens if tokens > rows else rows)
              + self.seq_ms * (seqs if seqs > rows else rows) + self.kv_token_ms * decode_kv
              + self.attention_mpair_ms * pairs / 1e6)
        return ms + self.prefill_pass_ms if prefill_tokens else ms

    def request_latency_ms(self, prompt_tokens: int) -> float:
        return self.request_ms + self.request_token_ms * prompt_tokens


class TimingModel:
    """Computes scaled (already divided by speedup) times of a pass."""

    __slots__ = (
        "_decode",
        "_decode_div",
        "_linear",
        "_prefill",
        "_prefill_div",
        "_request",
        "_total_kv_tokens",
        "request_after_share",
        "request_mode",
        "scaled_decode_ms",
    )

    def __init__(self, args: EngineArgs) -> None:
        self._total_kv_tokens = float(args.num_gpu_blocks * args.block_size)
        self._prefill_div = args.speedup_ratio
        self._decode_div = args.speedup_ratio * args.decode_speedup_ratio
        t = args.timing
        kind = t.get("type", "polynomial")
        prefill: Callable[[int], float]
        decode: Callable[[int], float]
        self._request: Interp1D | None = None
        self._linear: LinearPass | None = None
        #: where the request latency (a profile's ``request`` rows, the linear model's request
        #: terms) sits: mocker/engine/config.py REQUEST_MODES, and under ``delay`` the share of
        #: it after the first pass (REQUEST_AFTER_SHARE)
        self.request_mode: str = t.get("request_mode", REQUEST_MODES[0])
        self.request_after_share = float(t.get(REQUEST_AFTER_SHARE, 0.0))
        if kind == "linear":
            lin = self._linear = LinearPass.from_timing(t)
            # what `prefill_ms` / `decode_ms` report alone (plots, the fit report): a pass of
            # just that prefill, and a decode step of one sequence holding that KV
            prefill = lambda n: lin.pass_time_ms(n, prefill_pairs(n, 0), 1, 0, 0)  # noqa: E731
            decode = lambda kv: lin.pass_time_ms(0, 0.0, 1, 1, kv)  # noqa: E731
        elif kind == "fixed":
            pf, dc = float(t["prefill_ms"]), max(float(t["decode_ms"]), DECODE_FLOOR_MS)
            prefill = lambda n: pf if n > 0 else 0.0  # noqa: E731
            decode = lambda kv: dc  # noqa: E731
        elif kind == "profile":
            pi, di, self._request = load_profile(t["path"])
            prefill = lambda n: max(pi(n), 0.0) if n > 0 else 0.0  # noqa: E731
            decode = lambda kv: max(di(kv), DECODE_FLOOR_MS)  # noqa: E731
        else:
            total = self._total_kv_tokens
            prefill = polynomial_prefill_ms
            decode = lambda kv: polynomial_decode_ms(kv / total)  # noqa: E731
        self._prefill = prefill
        self._decode = decode
        #: `decode_ms` as one flat function (the scheduler's fast-forward calls it per pass);
        #: the same arithmetic in the same order, so the same floats.
        self.scaled_decode_ms: Callable[[int], float]
        div = self._decode_div
        if div == 0:
            self.scaled_decode_ms = lambda kv: 0.0
        elif kind == "polynomial":
            total = self._total_kv_tokens

            def scaled_decode_ms(kv: int) -> float:
                p = kv / total
                ms = DECODE_A * p * p + DECODE_B * p + DECODE_C
                return (ms if ms > DECODE_FLOOR_MS else DECODE_FLOOR_MS) / div

            self.scaled_decode_ms = scaled_decode_ms
        else:
            self.scaled_decode_ms = lambda kv: decode(kv) / div

    @property
    def linear(self) -> LinearPass | None:
        """The ``linear`` model's coefficients; None under the other models."""
        return self._linear

    def pass_ms(self, prefill_tokens: int, pairs: float, seqs: int, decode_seqs: int,
                decode_kv: int) -> float:
        """Scaled time of one pass: `prefill_tokens` new prompt tokens in chunks with `pairs`
        query-key pairs (`prefill_pairs`), `seqs` sequences scheduled, `decode_seqs` of them
        decoding one token while attending to `decode_kv` KV tokens.

        ``linear`` charges the pass as a whole, divided by ``speedup_ratio`` (times
        ``decode_speedup_ratio`` for a pass without prefill); the other models charge
        `prefill_ms` plus, when something decodes, `decode_ms`."""
        lin = self._linear
        if lin is not None:
            div = self._prefill_div if prefill_tokens else self._decode_div
            if div == 0:
                return 0.0
            ms = lin.pass_time_ms(prefill_tokens, pairs, seqs, decode_seqs, decode_kv)
            return (ms if ms > 0.0 else 0.0) / div
        duration = self.prefill_ms(prefill_tokens) if prefill_tokens else 0.0
        if decode_seqs:
            duration += self.decode_ms(decode_kv)
        return duration

    def decode_pass_fn(self, seqs: int) -> Callable[[int], float]:
        """The scaled time of a plain decode pass of `seqs` sequences, as a function of the KV
        tokens they attend to (the scheduler's fast-forward calls it once per pass)."""
        lin = self._linear
        if lin is None:
            return self.scaled_decode_ms
        div = self._decode_div
        if div == 0:
            return lambda kv: 0.0
        fixed = lin.pass_ms + (lin.token_ms + lin.seq_ms) * max(seqs, lin.weight_bound_rows)
        per_kv = lin.kv_token_ms
        return lambda kv: (fixed + per_kv * kv) / div

    def prefill_ms(self, new_tokens: int) -> float:
        """Scaled prefill time for a pass with `new_tokens` new prompt tokens."""
        if new_tokens <= 0 or self._prefill_div == 0:
            return 0.0
        return self._prefill(new_tokens) / self._prefill_div

    def decode_ms(self, active_kv_tokens: int) -> float:
        """Scaled decode time for a pass whose decode-ready requests hold `active_kv_tokens`."""
        if self._decode_div == 0:
            return 0.0
        return self._decode(active_kv_tokens) / self._decode_div

    def request_ms(self, prompt_tokens: int) -> float:
        """Scaled per-request latency before scheduling (a profile's ``request`` rows, the
        ``linear`` model's request terms; else 0)."""
        if self._prefill_div == 0:
            return 0.0
        if self._linear is not None:
            return max(self._linear.request_latency_ms(prompt_tokens), 0.0) / self._prefill_div
        if self._request is None:
            return 0.0
        return max(self._request(prompt_tokens), 0.0) / self._prefill_div

    def prompt_alone_ms(self, prompt_tokens: int, budget: int) -> float:
        """Scaled time from a prompt's arrival at an idle engine to its first token: its
        request latency, then its prefill in chunks of at most `budget` tokens, each pass
        holding nothing else. The longest an engine works with requests in flight and no token
        to show (launch.commands `stall_window_s`)."""
        total, done = self.request_ms(prompt_tokens), 0
        while done < prompt_tokens:
            chunk = min(budget, prompt_tokens - done)
            total += self.pass_ms(chunk, prefill_pairs(chunk, done), 1, 0, 0)
            done += chunk
        return total

    def request_parts_ms(self, prompt_tokens: int) -> tuple[float, float]:
        """`request_ms` split as the request's wait before it may be scheduled and its first
        token's wait after the pass that computed it (`request_after_share`)."""
        total = self.request_ms(prompt_tokens)
        after = total * self.request_after_share
        return total - after, after

    def unscaled_prefill_ms(self, new_tokens: int) -> float:
        return self._prefill(new_tokens) if new_tokens > 0 else 0.0

    def unscaled_decode_ms(self, active_kv_tokens: int) -> float:
        return self._decode(active_kv_tokens)


def kv_transfer_ms(args: EngineArgs, prompt_tokens: int) -> float:
    """Simulated KV transfer delay of a handed-off prompt, already divided by speedup_ratio.

    prompt_tokens * kv_bytes_per_token / (bandwidth GB/s * 1e9) seconds; 0 when the bandwidth
    or the speedup ratio is 0.
    """
    if args.kv_transfer_bandwidth <= 0 or args.speedup_ratio <= 0 or prompt_tokens <= 0:
        return 0.0
    seconds = prompt_tokens * args.kv_bytes_per_token / (args.kv_transfer_bandwidth * 1e9)
    return seconds * 1000.0 / args.speedup_ratio
