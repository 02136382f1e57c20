"""Pass timing models (docs/mocker.md "Timing"). All times in milliseconds.

Models (selected by `EngineArgs.timing["type"]`):

* ``polynomial`` (default): prefill on T = total new prompt tokens of the pass,
  ``4.209989e-07*T^2 + 1.518344e-02*T + 1.650142e+01`` (0 when T == 0); decode on
  p = active KV tokens / (num_gpu_blocks * block_size),
  ``-25.74*p^2 + 54.01*p + 5.74``, floored at 1 ms.
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
    (default) before the request may be scheduled; ``floor`` the request is scheduled at once
    and its first token is emitted no earlier than that latency after arrival.

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
from pathlib import Path

from .config import EngineArgs

PREFILL_A = 4.209989e-07
PREFILL_B = 1.518344e-02
PREFILL_C = 1.650142e01
DECODE_A = -25.74
DECODE_B = 54.01
DECODE_C = 5.74
DECODE_FLOOR_MS = 1.0
PROFILE_COLUMNS = ("kind", "tokens", "ms")


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


class TimingModel:
    """Computes scaled (already divided by speedup) prefill and decode times of a pass."""

    __slots__ = (
        "_decode",
        "_decode_div",
        "_prefill",
        "_prefill_div",
        "_request",
        "_total_kv_tokens",
        "request_is_floor",
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
        #: the profile's ``request`` rows are a first-token floor, not a scheduling delay
        self.request_is_floor = t.get("request_mode") == "floor"
        if kind == "fixed":
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
        elif kind not in ("fixed", "profile"):
            total = self._total_kv_tokens

            def scaled_decode_ms(kv: int) -> float:
                p = kv / total
                ms = DECODE_A * p * p + DECODE_B * p + DECODE_C
                return (ms if ms > DECODE_FLOOR_MS else DECODE_FLOOR_MS) / div

            self.scaled_decode_ms = scaled_decode_ms
        else:
            self.scaled_decode_ms = lambda kv: decode(kv) / div

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
        """Scaled per-request latency before scheduling (a profile's ``request`` rows; else 0)."""
        if self._request is None or self._prefill_div == 0:
            return 0.0
        return max(self._request(prompt_tokens), 0.0) / self._prefill_div

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
