"""`lab ps` on a real stack whose engine was killed and is not restarted (the default
`--restart-engine never`): the restarted sidecar's row says why it is not ready."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

from tests.waiting import wait_for

LAB = str(Path(sys.executable).with_name("lab"))


def lab(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([LAB, *args], capture_output=True, text=True, timeout=timeout)


async def test_ps_says_what_the_sidecar_waits_for(tmp_path: Path) -> None:
    run = tmp_path / "run"
    up = lab("up", "--detach", "--speedup", "0", "--grace", "3", "--out", str(run))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        engine = re.search(r"engine-0\s+\d+\s+(127\.0\.0\.1:\d+)", up.stdout)
        assert engine, up.stdout
        killed = lab("fault", str(run), "--process", "engine-0", "--kind", "kill")
        assert killed.returncode == 0, killed.stdout + killed.stderr
        pattern = re.compile(rf"sidecar-0 +\d+ +- +waiting .*^sidecar-0: waiting for engine "
                             rf"{engine[1]}: connection refused since \d\d:\d\d:\d\d, "
                             r"attempt \d+$", re.S | re.M)

        def shown() -> bool:
            return pattern.search(lab("ps", str(run)).stdout) is not None

        await wait_for(shown, timeout=60, interval=0.5, in_thread=True,
                       what="lab ps naming the sidecar's wait")
        ps_json = lab("ps", str(run), "--json").stdout
        assert "waiting for engine" in ps_json and "connection refused" in ps_json
    finally:
        await asyncio.to_thread(lab, "down", str(run))
