"""Run in the Dynamo venv: Dynamo 1.6.1's own mocker engine, offline (simulated time, no HTTP),
on a closed-loop synthetic workload; prints one JSON line of its summary.

    python tests/interop/dynamo_replay.py ISL OSL CONCURRENCY REQUESTS [ENGINE_ARGS_JSON]

`dynamo.replay.run_synthetic_trace_replay` drives the same Rust scheduler and timing model that
`python -m dynamo.mocker` runs live (compiled into `dynamo._core`), with `replay_concurrency`
requests in flight: a new one arrives the moment one finishes. Its `median_tpot_ms` is the
median over requests of (last token - first token) / (tokens - 1); `median_itl_ms` is the
median over every single gap.
"""

import json
import sys

from dynamo.replay import run_synthetic_trace_replay


def main() -> None:
    isl, osl, conc, n = (int(a) for a in sys.argv[1:5])
    engine_args = json.loads(sys.argv[5]) if len(sys.argv) > 5 else None
    report = run_synthetic_trace_replay(isl, osl, n, replay_concurrency=conc,
                                        extra_engine_args=engine_args)
    s = report.to_dict()["summary"]
    keys = ("median_ttft_ms", "mean_ttft_ms", "median_tpot_ms", "median_itl_ms", "duration_ms")
    print(json.dumps({k: s[k] for k in keys}))


if __name__ == "__main__":
    main()
