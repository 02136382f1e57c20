"""What the kernel says about the delayed-ACK timer, for the Nagle verdict (docs/nagle.md).

Linux delays an ACK by at least TCP_DELACK_MIN = HZ/25 jiffies = 40 ms (TCP_ATO_MIN, the same at
every HZ); a socket enters delayed-ACK "pingpong" mode after ``net.ipv4.tcp_pingpong_thresh``
quick replies (1 on the machines the lab was built on). A stall cluster whose excess over the
fast requests is near 40 ms (or a multiple, when two stalls stack) is consistent with Nagle
waiting for a delayed ACK. `kernel_facts()` reads what this machine has, so a verdict can say
whether the facts held.
"""

from __future__ import annotations

import gzip
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

DELACK_MIN_MS = 40.0  # TCP_DELACK_MIN / TCP_ATO_MIN = HZ/25 jiffies
NEAR_TIMER_TOLERANCE_MS = 12.0


@dataclass(frozen=True)
class KernelFacts:
    system: str
    release: str
    hz: int | None
    pingpong_thresh: int | None
    delack_min_ms: float = DELACK_MIN_MS

    def sentence(self) -> str:
        if self.system != "Linux":
            return f"{self.system} {self.release}: the Linux delayed-ACK facts do not apply as such"
        parts = [f"Linux {self.release}"]
        if self.hz:
            parts.append(f"HZ={self.hz}")
        parts.append(f"minimum delayed ACK {self.delack_min_ms:.0f} ms (HZ/25 jiffies)")
        if self.pingpong_thresh is not None:
            parts.append(f"net.ipv4.tcp_pingpong_thresh={self.pingpong_thresh}")
        return ", ".join(parts)

    def to_dict(self) -> dict:
        return {**asdict(self), "sentence": self.sentence()}


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _kernel_hz(release: str) -> int | None:
    """CONFIG_HZ from /proc/config.gz or /boot/config-<release>, if readable."""
    candidates = [Path("/proc/config.gz"), Path(f"/boot/config-{release}")]
    for path in candidates:
        try:
            if path.suffix == ".gz":
                text = gzip.decompress(path.read_bytes()).decode(errors="replace")
            else:
                text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("CONFIG_HZ="):
                try:
                    return int(line.split("=", 1)[1])
                except ValueError:
                    return None
    return None


def kernel_facts() -> KernelFacts:
    system, release = platform.system(), platform.release()
    if system != "Linux":
        return KernelFacts(system=system, release=release, hz=None, pingpong_thresh=None)
    return KernelFacts(
        system=system,
        release=release,
        hz=_kernel_hz(release),
        pingpong_thresh=_read_int(Path("/proc/sys/net/ipv4/tcp_pingpong_thresh")),
    )


def near_timer(excess_ms: float | None, timer_ms: float = DELACK_MIN_MS) -> int | None:
    """How many delayed-ACK timers (1 or 2) the cluster's excess matches, or None."""
    if excess_ms is None:
        return None
    for k in (1, 2):
        if abs(excess_ms - k * timer_ms) <= NEAR_TIMER_TOLERANCE_MS:
            return k
    return None
