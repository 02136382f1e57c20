"""Per-request cost of turning a raw OSL-128 SSE response into the client's record, the way the
client does it (build_record, then the sweep's run columns and the parquet row table).
Run with PYTHONPATH=<worktree>. Prints CPU us/request (process_time, min of rounds) and
cProfile function calls per request."""
import cProfile, inspect, pstats, sys, time
import orjson
from lab.load import client
from lab.load.sse import RawResponse
from lab.analysis.rundir import records_table

def raw(i):
    pieces, times = [], []
    for k in range(128):
        ev = {"id": "cmpl-x", "object": "text_completion", "created": 1, "model": "m",
              "choices": [{"index": 0, "text": f" tok{k}", "finish_reason": None}]}
        pieces.append(b"data: " + orjson.dumps(ev) + b"\n\n"); times.append(1000 + k)
    pieces.append(b"data: " + orjson.dumps({"id": "cmpl-x", "choices": [{"index": 0, "text": "", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 136, "completion_tokens": 128}}) + b"\n\n"); times.append(2000)
    pieces.append(b"data: [DONE]\n\n"); times.append(2001)
    return RawResponse(sent_ns=1, status=200, times=times, pieces=pieces, done_ns=2002)

N = 2000
raws = [raw(i) for i in range(N)]
new = "sent" in inspect.signature(client.build_record).parameters
def one_level():
    recs = []
    if new:
        from lab.load.record import Sent, rows
        for i, r in enumerate(raws):
            rec = client.build_record(r, Sent(i, None, 0, 136, 128, True), prefix="c1-", warmup=False, proc=0)
            rec.run_id = "x"; rec.repeat = 0; rec.concurrency = 1
            recs.append(rec)
        return records_table(rows(recs))
    for i, r in enumerate(raws):
        rec = client.build_record(r, True, index=i, prefix="c1-", warmup=False, scheduled_ns=0, isl=136, osl=128, proc=0)
        rec["run_id"] = "x"; rec["repeat"] = 0; rec["concurrency"] = 1
        recs.append(rec)
    return records_table(recs)

best = 1e9
for _ in range(7):
    t = time.process_time(); one_level(); best = min(best, time.process_time() - t)
pr = cProfile.Profile(); pr.enable(); one_level(); pr.disable()
calls = pstats.Stats(pr).total_calls
print(f"{'record' if new else 'dict'}: {best / N * 1e6:.1f} us CPU/request (min of 7), {calls / N:.1f} calls/request")
