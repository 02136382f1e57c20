"""`lab nagle --target URL --model NAME` against the lab's own frontend, started separately (a
Stack the probe did not launch): it runs the traffic shapes and gives a verdict; bad targets and
unknown models fail with a clear message and exit 2."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from lab.shared.settings import SocketSettings
from launch.stack import Stack
from launch.topology import TopologySpec
from tests import in_process

N = 30


async def _lab(*args: str, timeout: float = 70.0) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "from lab.cli import main; main()", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    return proc.returncode or 0, out.decode(), err.decode()


async def test_external_probe_localises_a_stall_in_the_http_response_path(tmp_path: Path) -> None:
    # The stack the user points at writes its HTTP responses without TCP_NODELAY (headers, then
    # each SSE event): the probe does not know that, and must find the stall on kept-alive
    # connections, not on fresh ones, and only when streaming.
    spec = TopologySpec.aggregated(
        engines=1, speedup=1000.0, sockets=SocketSettings(http_nodelay=False)
    )
    async with Stack(spec, tmp_path / "stack") as stack:
        url, model = stack.frontend_url, stack.model
        out = tmp_path / "probe"
        rc, stdout, stderr = await _lab(
            "nagle", "--target", url, "--model", model, "--out", str(out), "--requests", str(N),
            "--osl", "16", "--many", "8", "--gap-ms", "50",
        )
        assert rc == 0, stderr[-3000:]
        # unknown model and unreachable target: clear messages, exit 2, no run directory
        rc2, _, err2 = await _lab("nagle", "--target", url, "--model", "no-such-model",
                                  "--out", str(tmp_path / "bad"))
    assert rc2 == 2 and "--model" in err2 and "no-such-model" in err2 and model in err2, err2
    assert "Traceback" not in err2
    assert not (tmp_path / "bad").exists()

    doc = json.loads((out / "nagle.json").read_text())
    assert doc["mode"] == "external" and doc["target"] == url
    arms = {a["name"] for a in doc["arms"]}
    assert arms == {"reused", "fresh-connection", "gap-50ms", "non-streaming"}
    reused = doc["stats"]["reused"]["levels"]["1"]
    assert reused["n"] == N and reused["cluster_share"] > 0.5, reused
    verdict = doc["verdict"]
    assert verdict["outcome"] == "stall present", verdict
    assert "the delayed-ACK timer" in verdict["text"]
    assert "present on a reused connection and absent on fresh ones" in verdict["text"]
    # without streaming there is no second small write to hold back; a busy 2-core machine
    # can still push a few full-response times 30 ms up, so "reduced" is accepted, "present
    # too" is not
    assert "present without streaming too" not in verdict["text"], verdict["text"]
    assert "stall present" in stdout
    assert "TTFT is the full response time" in (out / "report.md").read_text()


def test_external_probe_unreachable_target_fails_clearly(tmp_path: Path) -> None:
    ran = in_process.lab("nagle", "--target", "http://127.0.0.1:9", "--model", "m",
                         "--out", str(tmp_path / "x"))
    assert ran.returncode == 2, ran.stderr
    assert "--target" in ran.stderr and "cannot reach http://127.0.0.1:9" in ran.stderr
    assert "Traceback" not in ran.stderr
    ran = in_process.lab("nagle", "--target", "http://127.0.0.1:9")
    assert ran.returncode == 2 and "--target" in ran.stderr and "cannot reach" in ran.stderr
    # (before any --model check)
