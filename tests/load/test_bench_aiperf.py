"""`python -m tests.bench.bench_aiperf`: bad input is a usage error naming the option, checked
before anything is run against the target (the benchmark itself needs the Dynamo anchor and
AIPerf: docs/open-loop.md "Against AIPerf"); the server's view of each run from vLLM's /metrics
(tests/bench/server_metrics.py), over a real local HTTP server; and the rounds, with the two
tools stood in for."""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.bench import bench_aiperf
from tests.bench.bench_aiperf import main, round_order
from tests.bench.server_metrics import (
    PREFILL,
    PREFIX_HITS,
    TTFT,
    WATCHED,
    MetricsPoller,
    ServerReading,
    increase,
    mean_after_warmup,
    parse_samples,
)
from tests.usage_errors import assert_usage_error


def _invoke(tmp_path: Path, *args: str) -> tuple[int | None, str]:
    anchors = tmp_path / "anchors"
    anchors.mkdir(exist_ok=True)
    (anchors / "aiperf.sh").touch()
    model = tmp_path / "anchor" / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "tokenizer.json").write_text("{}")
    base = ["--target", "http://127.0.0.1:9", "--anchors", str(anchors), "--anchor-dir",
            str(model.parent), "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(main, [*base, *args])
    return result.exit_code, result.output


def test_bad_rates_are_usage_errors(tmp_path: Path) -> None:
    code, out = _invoke(tmp_path, "--rate", "0,abc")
    assert_usage_error(code, out, "--rate")


def test_an_anchor_dir_without_the_tokenizer_is_named(tmp_path: Path) -> None:
    code, out = _invoke(tmp_path, "--anchor-dir", str(tmp_path / "nothing"))
    assert_usage_error(code, out, "--anchor-dir")
    assert "tokenizer.json" in out


def test_a_used_out_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "old").touch()
    code, out = _invoke(tmp_path, "--rate", "10")
    assert_usage_error(code, out, "--out")


def test_aiperf_runs_with_the_options_that_cut_its_cpu(tmp_path: Path) -> None:
    """run_aiperf hands aiperf.sh the rate, the arrival and AIPERF_LEAN_ARGS (a stand-in
    aiperf.sh records its argv and writes the summary.json a real one would)."""
    from tests.bench.bench_aiperf import AIPERF_LEAN_ARGS, run_aiperf

    anchors = tmp_path / "anchors"
    anchors.mkdir()
    script = anchors / "aiperf.sh"
    script.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$5/argv"\n'
                      'echo \'{"req_s": 50.0, "ttft_p50_ms": 4.0, "client_cpu_pct": 25.0, '
                      '"errors": 0}\' > "$5/summary.json"\n')
    script.chmod(0o755)
    out = tmp_path / "run"
    out.mkdir()
    r = run_aiperf(anchors, tmp_path, "http://127.0.0.1:9", "m", out, 50.0, 100, 8)
    argv = (out / "argv").read_text().split("\n")[:-1]
    assert argv[5:] == ["--request-rate", "50", "--arrival-pattern", "poisson",
                        *AIPERF_LEAN_ARGS]
    assert "--no-server-metrics" in argv and "summary" in argv
    assert r["cpu_ms"] == 5.0  # 25% of a core at 50 req/s


def test_zero_rounds_is_a_usage_error(tmp_path: Path) -> None:
    code, out = _invoke(tmp_path, "--rate", "10", "--rounds", "0")
    assert_usage_error(code, out, "--rounds")


def test_rounds_alternate_the_order_within_a_rate_and_across_rates() -> None:
    assert [round_order(0, i) for i in range(3)] == [("lab", "aiperf"), ("aiperf", "lab"),
                                                     ("lab", "aiperf")]
    assert [round_order(1, i) for i in range(2)] == [("aiperf", "lab"), ("lab", "aiperf")]


# vLLM's /metrics, cut down: a histogram's buckets and _created beside _sum and _count, one
# series per engine, a counter, a label value holding '}' and a space, a sample with a timestamp.
VLLM_METRICS = """\
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.04",model_name="m"} 7.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 10.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 0.5
vllm:time_to_first_token_seconds_count{engine="1",model_name="odd} name"} 30.0
vllm:time_to_first_token_seconds_sum{engine="1",model_name="odd} name"} 1.5 1700000000000
vllm:time_to_first_token_seconds_created{engine="0",model_name="m"} 1.7e9
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 4096.0
vllm:prefix_cache_hits_created{engine="0",model_name="m"} 1.7e9
vllm:num_requests_running{engine="0",model_name="m"} 3.0
not a sample line
"""


def test_prometheus_samples_are_summed_across_label_sets() -> None:
    every = parse_samples(VLLM_METRICS)
    assert every["vllm:time_to_first_token_seconds_count"] == 40.0  # engines 0 and 1
    assert every["vllm:time_to_first_token_seconds_sum"] == 2.0
    assert every["vllm:prefix_cache_hits_total"] == 4096.0
    assert every["vllm:num_requests_running"] == 3.0
    watched = parse_samples(VLLM_METRICS, WATCHED)
    assert watched == {"vllm:time_to_first_token_seconds_count": 40.0,
                       "vllm:time_to_first_token_seconds_sum": 2.0,
                       "vllm:prefix_cache_hits_total": 4096.0}


def _polls(*counts_sums: tuple[float, float]) -> list[dict[str, float]]:
    return [{f"{TTFT}_count": c, f"{TTFT}_sum": s} for c, s in counts_sums]


def test_the_server_mean_leaves_out_the_warmup() -> None:
    # before the run 100 requests (sum 9 s); a warm-up of 8 at 1 s each, then 10 measured at
    # 40 ms: the first poll at 108 or more (109: one measured request is in it) starts the mean
    polls = _polls((100, 9.0), (104, 13.0), (109, 17.04), (113, 17.2), (118, 17.4))
    assert mean_after_warmup(polls, TTFT, 8) == pytest.approx(0.04)
    assert mean_after_warmup(polls, TTFT, 0) == pytest.approx(8.4 / 18)
    assert mean_after_warmup(polls, TTFT, 19) is None  # the run never got past its warm-up
    assert mean_after_warmup(polls[:3], TTFT, 9) is None  # nothing observed after it
    assert mean_after_warmup(polls, PREFILL, 8) is None  # no such histogram
    assert mean_after_warmup(polls[:1], TTFT, 0) is None


def test_prefix_hits_are_the_counters_increase() -> None:
    polls = [{"vllm:prefix_cache_hits_total": 100.0}, {"vllm:prefix_cache_hits_total": 1460.0}]
    assert increase(polls, PREFIX_HITS) == 1360.0
    assert increase([{"vllm:prefix_cache_hits": 5.0}, {"vllm:prefix_cache_hits": 5.0}],
                    PREFIX_HITS) == 0.0
    assert increase(_polls((1, 1.0), (2, 2.0)), PREFIX_HITS) is None
    reading = ServerReading.of(_polls((0, 0.0), (4, 4.0), (6, 4.1)), 4)
    assert reading == ServerReading(ttft_ms=pytest.approx(50.0), prefill_ms=None,
                                    prefix_hit_tokens=None)


def vllm_text(count: int, total: float, hits: float = 0.0) -> str:
    """A vLLM /metrics page whose TTFT and prefill histograms and prefix-cache counter stand at
    these totals (split over two engines; prefill is a quarter of TTFT)."""
    lines = []
    for engine, share in (("0", 0.25), ("1", 0.75)):
        labels = f'{{engine="{engine}",model_name="m"}}'
        lines += [f"{TTFT}_count{labels} {count * share}", f"{TTFT}_sum{labels} {total * share}",
                  f"{PREFILL}_count{labels} {count * share}",
                  f"{PREFILL}_sum{labels} {total * share / 4}",
                  f"vllm:prefix_cache_hits_total{labels} {hits * share}"]
    return "\n".join(lines) + "\n"


class _Server(ThreadingHTTPServer):
    def server_bind(self) -> None:
        """HTTPServer's, without its reverse DNS look-up of the host (socket.getfqdn)."""
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = "127.0.0.1", self.server_address[1]


class MetricsServer:
    """GET /metrics on 127.0.0.1, port 0, answering the text last given to `show`, which
    returns once a GET has been answered with it (so a poller has seen every state)."""

    def __init__(self, text: str) -> None:
        self._text, self._shown, self._served = text, 0, 0
        self._cond = threading.Condition()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                with server._cond:
                    body, shown = server._text.encode(), server._shown
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                with server._cond:
                    server._served = max(server._served, shown)
                    server._cond.notify_all()

            def log_message(self, *_args: object) -> None:
                pass

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,),
                                        daemon=True)
        self._thread.start()

    def set(self, text: str) -> None:
        """Answer `text` from now on."""
        with self._cond:
            self._text, self._shown = text, self._shown + 1

    def show(self, text: str) -> None:
        """Answer `text` from now on, and return once a GET has been answered with it."""
        self.set(text)
        with self._cond:
            assert self._cond.wait_for(lambda: self._served >= self._shown, timeout=30), \
                "no GET /metrics within 30 s"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join()


@pytest.fixture
def metrics() -> Iterator[MetricsServer]:
    server = MetricsServer(vllm_text(100, 9.0))
    yield server
    server.close()


def test_the_poller_reads_the_run_from_a_real_server(metrics: MetricsServer) -> None:
    """Polled over HTTP from before the run to after it: the warm-up (8 at 1 s) is left out,
    the measured requests (10 at 40 ms) are the mean, across the two engines' series."""
    with MetricsPoller(metrics.url + "/metrics", interval_s=0.01) as poller:
        metrics.show(vllm_text(104, 13.0))
        metrics.show(vllm_text(108, 17.0))
        metrics.show(vllm_text(113, 17.2))
        metrics.set(vllm_text(118, 17.4, hits=512))  # only the poll on exit is sure to see it
    reading = ServerReading.of(poller.snapshots, 8)
    assert reading.ttft_ms == pytest.approx(40.0)
    assert reading.prefill_ms == pytest.approx(10.0)
    assert reading.prefix_hit_tokens == pytest.approx(512)
    assert len(poller.snapshots) >= 5


def test_rounds_alternate_with_their_own_seeds_and_the_server_view(
        tmp_path: Path, metrics: MetricsServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--rate 10,20 --rounds 2` against a vLLM-like /metrics, the two tools stood in for: each
    stand-in moves the server's histograms as its run would (the lab's target-check probe, then
    its warm-up at 1 s each, then its measured requests at 40 ms; AIPerf's warm-up, then its
    measured requests at 50 ms) and returns figures that depend on the lab's seed."""
    calls: list[tuple[str, float, str, int | None]] = []
    state = {"count": 100, "total": 9.0, "hits": 0.0}

    def move(count: int, each_s: float, hits: float = 0.0, last: bool = False) -> None:
        """The server's counters move on; but for a run's last move (which the poll after the
        run reads), the poller is waited for."""
        state["count"] += count
        state["total"] += count * each_s
        state["hits"] += hits
        text = vllm_text(int(state["count"]), state["total"], state["hits"])
        metrics.set(text) if last else metrics.show(text)

    def fake_lab(target: str, model: str, tokenizer: Path, out: Path, rate: float, requests: int,
                 cap: int, seed: int, osl: int) -> dict:
        calls.append(("lab", rate, out.name, seed))
        move(1 + cap - 1, 1.0)  # the probe, the warm-up but its last
        move(1, 1.0)
        move(requests, 0.040, last=True)
        k = seed - 42
        return {"achieved": 10.0 - k, "sent": 10.0, "completed": 10.0, "ttft_p50": 40.0 + 4 * k,
                "cpu_ms": 1.0, "errors": 0}

    def fake_aiperf(anchors: Path, anchor_dir: Path, target: str, model: str, out: Path,
                    rate: float, requests: int, cap: int, osl: int, records: bool) -> dict:
        calls.append(("aiperf", rate, out.name, None))
        move(cap, 1.0)
        move(requests, 0.050, hits=1360.0 if out.name == "aiperf-10-2" else 0.0, last=True)
        return {"achieved": 10.0, "aiperf_req_s": 10.0, "issued": float("nan"),
                "sent": float("nan"), "ttft_p50": 50.0, "cpu_ms": 5.0, "errors": 0}

    monkeypatch.setattr(bench_aiperf, "run_lab", fake_lab)
    monkeypatch.setattr(bench_aiperf, "run_aiperf", fake_aiperf)
    code, out = _invoke(tmp_path, "--target", metrics.url, "--rate", "10,20", "--rounds", "2",
                        "--requests", "10", "--max-concurrency", "8")
    assert code == 0, out
    assert calls == [("lab", 10, "lab-10-1", 42), ("aiperf", 10, "aiperf-10-1", None),
                     ("aiperf", 10, "aiperf-10-2", None), ("lab", 10, "lab-10-2", 43),
                     ("aiperf", 20, "aiperf-20-1", None), ("lab", 20, "lab-20-1", 42),
                     ("lab", 20, "lab-20-2", 43), ("aiperf", 20, "aiperf-20-2", None)]
    assert f"server view: {metrics.url}/metrics has vLLM's TTFT histogram" in out
    rows = [line for line in out.splitlines() if " achieved " in line and "req/s" in line
            and "medians" not in line]
    assert len(rows) == 8
    for row in rows:
        want = "40.00" if " lab " in row else "50.00"
        prefill = "10.00" if " lab " in row else "12.50"
        assert f"server TTFT mean    {want} ms (prefill {prefill} ms)" in row, out
    assert "rate=10      round 2/2 lab    achieved     9.0 req/s" in out
    summaries = [line for line in out.splitlines() if "medians over 2 rounds" in line]
    assert len(summaries) == 2, out
    for summary in summaries:
        assert ("lab achieved 9.5 req/s (spread 10.5%) TTFT p50 42.00 ms (spread 9.5%) server "
                "TTFT mean 40.00 ms (spread 0.0%); aiperf achieved 10.0 req/s (spread 0.0%) "
                "TTFT p50 50.00 ms (spread 0.0%) server TTFT mean 50.00 ms (spread 0.0%); "
                "lab/AIPerf of the medians: achieved 0.950  TTFT p50 0.840  server TTFT mean "
                "0.800") in summary, out
    warnings = [line for line in out.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1, out
    assert "1360 prompt tokens during aiperf's run at rate 10 (aiperf-10-2)" in warnings[0]
    assert "vllm.sh up --no-prefix-caching" in warnings[0]


def test_without_vllm_metrics_the_server_column_is_na(
        tmp_path: Path, metrics: MetricsServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A target whose /metrics is not vLLM's (the Dynamo anchor's): nothing polled, "n/a";
    one round keeps the run directories' names of one round (lab-R/, aiperf-R/), no summary."""
    metrics.set("dynamo_frontend_requests_total 3\n")
    dirs: list[str] = []

    def fake(*args: object) -> dict:
        runs = [a for a in args if isinstance(a, Path) and a.name.startswith(("lab-", "aiperf-"))]
        dirs.append(runs[0].name)
        return {"achieved": 10.0, "sent": 10.0, "ttft_p50": 40.0, "cpu_ms": 1.0, "errors": 0}

    monkeypatch.setattr(bench_aiperf, "run_lab", fake)
    monkeypatch.setattr(bench_aiperf, "run_aiperf", fake)
    code, out = _invoke(tmp_path, "--target", metrics.url, "--rate", "10")
    assert code == 0, out
    assert "server view: n/a" in out
    assert dirs == ["lab-10", "aiperf-10"]
    rows = [line for line in out.splitlines() if "req/s" in line]
    assert len(rows) == 2 and all(row.endswith("server TTFT mean n/a") for row in rows), out
    assert "medians" not in out
