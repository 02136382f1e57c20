"""Per-request cost of turning a raw OSL-128 SSE response into the client's record, the way the
client does it (build_record, the sweep's run columns, the parquet row table).

    PYTHONPATH=<worktree> python tests/load/record_cost.py

Prints CPU us/request (process_time, min of 7 rounds) and cProfile function calls per request;
run it against a tree with the old dict records and this one to compare."""

from __future__ import annotations

import cProfile
import inspect
import pstats
import time

import orjson

from lab.analysis.rundir import records_table
from lab.load import client
from lab.load.sse import RawResponse

N = 2000


def raw() -> RawResponse:
    pieces, times = [], []
    for k in range(128):
        ev = {"id": "cmpl-x", "object": "text_completion", "created": 1, "model": "m",
              "choices": [{"index": 0, "text": f" tok{k}", "finish_reason": None}]}
        pieces.append(b"data: " + orjson.dumps(ev) + b"\n\n")
        times.append(1000 + k)
    last = {"id": "cmpl-x", "choices": [{"index": 0, "text": "", "finish_reason": "length"}],
            "usage": {"prompt_tokens": 136, "completion_tokens": 128}}
    pieces += [b"data: " + orjson.dumps(last) + b"\n\n", b"data: [DONE]\n\n"]
    times += [2000, 2001]
    return RawResponse(sent_ns=1, status=200, times=times, pieces=pieces, done_ns=2002)


RAWS = [raw() for _ in range(N)]
TYPED = "sent" in inspect.signature(client.build_record).parameters


def one_level() -> object:
    if TYPED:
        from lab.load.record import Sent, rows

        recs = []
        for i, r in enumerate(RAWS):
            rec = client.build_record(r, Sent(i, None, 0, 136, 128, True), prefix="c1-",
                                      warmup=False, proc=0)
            rec.run_id, rec.repeat, rec.concurrency = "x", 0, 1
            recs.append(rec)
        return records_table(rows(recs))
    dicts = []
    for i, r in enumerate(RAWS):
        d = client.build_record(r, True, index=i, prefix="c1-",  # type: ignore[call-arg]
                                warmup=False, scheduled_ns=0, isl=136, osl=128, proc=0)
        d.update(run_id="x", repeat=0, concurrency=1)  # type: ignore[attr-defined]
        dicts.append(d)
    return records_table(dicts)  # type: ignore[arg-type]


def main() -> None:
    best = 1e9
    for _ in range(7):
        t = time.process_time()
        one_level()
        best = min(best, time.process_time() - t)
    prof = cProfile.Profile()
    prof.enable()
    one_level()
    prof.disable()
    calls = pstats.Stats(prof).total_calls  # type: ignore[attr-defined]
    print(f"{'record' if TYPED else 'dict'}: {best / N * 1e6:.1f} us CPU/request (min of 7), "
          f"{calls / N:.1f} calls/request")


if __name__ == "__main__":
    main()
