"""Multi-turn conversations (`--turns N`, `--think-ms`) on the chat endpoint.

Each turn sends the whole history, as chat clients do: the earlier turns' user messages and the
answers the server gave them (the answer's text is kept for that, `keep_text`), then the new user
message (`--isl` tokens of the workload's prompts). A turn is sent `think_ms` after the
previous answer ended; its record carries the conversation id and the turn (0 first), and its
`intended_ns` is when it was meant to go: the conversation's arrival for turn 0, the previous
answer's end plus the think time after that (so the intended-time figures count a late send).

Closed loop (`concurrency`): that many conversations in flight, the next one started when one
ends. Open loop (`offsets_ns`): conversations arrive at the level's schedule, whatever the
server does, and turns follow their predecessor. One client process, one kept-alive connection
per conversation in flight. Failed turns are records (the conversation stops there: its next
turn would have no answer to carry).
"""

from __future__ import annotations

import asyncio
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import orjson

from lab.load.client import (
    _HEADERS,
    LevelProgress,
    LevelResult,
    RecordBook,
    connect_for,
    endpoint_url,
)
from lab.load.client_settings import IN_PROCESS, ClientSettings
from lab.load.http1 import Http1Connection, Origin, post_request
from lab.load.record import Sent
from lab.load.sse import RawResponse
from lab.load.workload import Prompts, WorkloadSpec, build_body, output_len


@dataclass(frozen=True)
class Conversations:
    """The conversation shape of a level: `turns` turns, `think_ms` between an answer and the
    next turn."""

    turns: int = 1
    think_ms: float = 0.0

    def to_dict(self) -> dict:
        return {"turns": self.turns, "think_ms": self.think_ms}


class _ConversationDriver(RecordBook):
    def __init__(self, url: str, spec: WorkloadSpec, model: str, level_seed: int,
                 shape: Conversations, options: ClientSettings, warmup: int) -> None:
        super().__init__(options, warmup, 0)  # warmup: conversations (all their turns)
        self.spec = spec
        self.model = model
        self.level_seed = level_seed
        self.shape = shape
        self.prompts = Prompts(spec)
        self.origin = Origin.from_url(endpoint_url(url, {"messages": []}))
        self.head = self.origin.post_head(dict(_HEADERS))

    async def conversation(self, conv: int, start_ns: int) -> None:
        """All turns of conversation `conv`, the first due at `start_ns`."""
        perf = time.perf_counter_ns
        history: list[dict] = []
        conn: Http1Connection | None = None
        due = start_ns
        turns = self.shape.turns
        try:
            for turn in range(turns):
                # the loop's timers may fire a little before perf_counter says it is time
                while (wait := due - perf()) > 0:
                    await asyncio.sleep(wait / 1e9)
                released = perf()
                index = conv * turns + turn
                body = build_body(self.spec, self.model, self.level_seed, index,
                                  prompts=self.prompts)
                history.append(body["messages"][0])
                body["messages"] = list(history)
                isl = self.prompts.prompt(self.level_seed, index)[1]
                osl = output_len(self.spec, self.level_seed, index)
                sent = Sent(index, due, released, isl, osl, bool(body.get("stream")), conv, turn)
                raw = RawResponse(sent_ns=perf())
                conn = await self._send(conn, raw, index, orjson.dumps(body), sent.streaming)
                rec = self.book(sent, raw, keep_text=True, warmup=conv < self.warmup)
                if not rec.ok:
                    return
                history.append({"role": "assistant", "content": rec.text or ""})
                rec.text = None  # kept only until the next turn carries it
                due = (rec.done_ns or perf()) + int(self.shape.think_ms * 1e6)
        finally:
            if conn is not None:
                conn.close()

    async def _send(self, conn: Http1Connection | None, raw: RawResponse, index: int,
                    data: bytes, streaming: bool) -> Http1Connection | None:
        """One turn on the conversation's connection (opened, or reopened, as needed); returns
        when its response is read, with `raw` filled (an error is `raw.error_kind`)."""
        opts = self.options
        if conn is not None and conn.stale(raw.sent_ns):  # idle past the server's keep-alive
            conn.close()
        if conn is None or conn.closed:
            conn = await connect_for(self.origin, opts, raw)
            if conn is None:
                return None
        done: asyncio.Future[Http1Connection] = asyncio.get_running_loop().create_future()

        def on_response(c: Http1Connection, r: RawResponse, reusable: bool) -> None:
            if not reusable:
                c.close()
            if not done.done():
                done.set_result(c)  # a new connection when the request was resent

        rid = b"X-Request-Id: %s%d\r\n" % (opts.request_id_prefix.encode(), index)
        conn.request(post_request(self.head, rid, data), raw, streaming, on_response,
                     opts.timeout)
        conn = await done
        return None if conn.closed else conn


async def run_conversation_level(url: str, spec: WorkloadSpec, model: str, level_seed: int,
                                 shape: Conversations, n: int, *,
                                 concurrency: int | None = None,
                                 offsets_ns: np.ndarray | None = None, rate: float | None = None,
                                 warmup: int = 0, options: ClientSettings | None = None,
                                 progress: Callable[[LevelProgress], None] | None = None
                                 ) -> LevelResult:
    """`n` conversations: `concurrency` at a time (closed loop), or each starting at its
    `offsets_ns` entry after the level's start (open loop, `rate` the offered one). The first
    `warmup` conversations are flagged warm-up. Records sorted by index (conversation-major)."""
    options = options or IN_PROCESS
    driver = _ConversationDriver(url, spec, model, level_seed, shape, options, warmup)
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter_ns()

    async def ticker() -> None:
        while True:
            await asyncio.sleep(0.5)
            if progress:
                progress(LevelProgress(len(driver.records), n * shape.turns, driver.errors,
                                       (time.perf_counter_ns() - t0) / 1e9))

    async with asyncio.TaskGroup() as tg:
        tick = tg.create_task(ticker())
        lag = tg.create_task(driver.lag_ticker())
        if offsets_ns is not None:
            async with asyncio.TaskGroup() as convs:
                for conv, offset in enumerate(offsets_ns):
                    convs.create_task(driver.conversation(conv, t0 + int(offset)))
        else:
            claimed = iter(range(n))

            async def slot() -> None:
                for conv in claimed:
                    await driver.conversation(conv, time.perf_counter_ns())

            async with asyncio.TaskGroup() as slots:
                for _ in range(max(1, concurrency or 1)):
                    slots.create_task(slot())
        tick.cancel()
        lag.cancel()
    t1 = time.perf_counter_ns()
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    records = sorted(driver.records, key=lambda r: r.index)
    for r in records:
        r.concurrency = 0 if offsets_ns is not None else int(concurrency or 1)
        r.rate = float(rate) if offsets_ns is not None and rate is not None else None
    info = {"proc": 0, "started_ns": t0, "ended_ns": t1,
            "cpu_s": (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime),
            "requests": len(records), "loop_lags_ns": driver.lags_ns,
            "resends": driver.resends}
    return LevelResult(concurrency=records[0].concurrency if records else 0, records=records,
                       procs=[info])
