"""The vLLM-style scheduler pass loop (docs/mocker.md "Scheduler"). Pure: the caller owns time.

One `step(now_ms)` is one forward pass:

1. ``budget = max_num_batched_tokens``.
2. Running requests first, oldest first. A decode-ready request (KV covers its whole sequence
   but the last sampled token) schedules 1 token; a prefilling request schedules
   ``min(remaining, budget)`` tokens (chunked prefill), or waits for a pass with enough budget
   when chunked prefill is off. Blocks are allocated for the tokens scheduled this pass. If the
   pool is exhausted: policy ``vllm`` preempts the newest running request (LIFO), releasing its
   blocks and pushing it to the **front** of waiting with ``num_computed = 0`` (recompute:
   prompt plus already generated tokens), and retries; policy ``trtllm`` never preempts (its
   admission reserved enough; a failure is counted in ``EngineMetrics.alloc_stalls``).
3. Then waiting requests, FIFO, while ``running < max_num_seqs``, budget remains and nothing
   was preempted this pass. Requests whose ``ready_at_ms`` is in the future (KV transfer) are
   skipped without blocking the queue. Admission (``_try_admit``):

   * ``vllm``: admit iff ``ceil(seq_len / bs) - active cached prefix blocks <= free``.
   * ``trtllm`` (GUARANTEED_NO_EVICT): ``needed = ceil((prompt + max_out) / bs) - active
     cached prefix blocks``; ``available = free - sum(to-completion blocks still missing from
     every running request)``; admit iff ``needed <= available``.

   Otherwise the request **waits** and the loop stops (head of line).
4. Timing: `TimingModel.pass_ms` of what the pass holds: its new prompt tokens T (and their
   attention's query-key pairs), the requests it scheduled, and the decode set with the sum
   of its sequence lengths. The ``linear`` model charges all of it as one pass; the others
   charge ``prefill_ms(T)`` plus ``decode_ms`` of that sum when the decode set is not empty.
5. At pass end every request whose KV now covers its whole sequence emits one token.

First token: the pass that finishes a prompt emits the first token under both policies (real
engines sample it from the context phase). What it costs is ``first_token_decode``
(EngineArgs): off, it is sampled from the prefill itself (the request is not part of the
pass's decode set: no decode time is charged for it); on, the request joins that pass's decode
set (its sequence counts in p and the pass is charged a decode step). Off by default under
both policies, as real engines and Dynamo's mocker do (docs/mocker.md "The first token under
trtllm"). Exception, as the reference's prefill workers do: a request whose
whole output is one token (``max_output_tokens == 1``, the prefill role) emits it with zero
decode time either way.

Normalization at `add` (both policies, so a request always fits once alone): a prompt that
fills the pool (``prompt_len >= num_gpu_blocks * block_size``) or, with chunked prefill off,
exceeds ``max_num_batched_tokens`` is rejected (``Signal(rejected=True, completed=True,
token_id=None)`` on the next pass); ``max_output_tokens`` is clamped to
``capacity_tokens - prompt_len`` (and, for ``vllm`` without chunked prefill, to
``max_num_batched_tokens - prompt_len + 1`` so a recompute always fits one pass, as vLLM
requires ``max_num_batched_tokens >= max_model_len`` there).

Handoff (decode leg): ``kv_transferred=True`` admits with the prompt KV present (blocks
allocated, no prefill compute, unless it was preempted and must recompute); ``first_position``
is the first position this engine emits (positions below it were replayed by the server);
the request completes after position ``max_output_tokens - 1``. If ``first_position >=
max_output_tokens`` nothing is generated: a ``Signal(token_id=None, completed=True)`` is queued.

Prefix caching: only full prompt blocks are cached (see kv_pool). A prefix hit is capped at
``seq_len - 1`` tokens (the last prompt token is always recomputed); under ``vllm`` it is whole
blocks within that, as vLLM's (a fully cached prompt recomputes its last block). It is
reported once, on the request's first signal, as ``cached_tokens``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .config import EngineArgs
from .kv_pool import ROOT_HASH, KvPool, block_hashes
from .timing import TimingModel, prefill_pairs

_WAITING = 0
_RUNNING = 1
_DONE = 2
_RECENT_PASSES = 256


@dataclass
class EngineRequest:
    key: str  # unique in-flight key (the server uses the request_id)
    prompt: list[int]
    max_output_tokens: int
    token_at: Callable[[int], int]  # position -> token id
    first_position: int = 0  # decode after handoff: 1 (position 0 was replayed)
    kv_transferred: bool = False  # decode after handoff: prompt KV already present
    ready_at_ms: float = 0.0  # not schedulable before this simulated time
    #: the first token comes out this long after the pass that computed it (a target's path
    #: on the way out: `request_after_share`)
    first_delay_ms: float = 0.0


@dataclass(slots=True)
class Signal:
    """One per request per pass that produced something."""

    key: str
    token_id: int | None  # None when rejected (or when nothing was left to generate)
    position: int
    completed: bool
    rejected: bool = False
    cached_tokens: int | None = None  # on the request's first signal only


@dataclass(slots=True)
class PassResult:
    """One pass. Its `signals` are visible at its end (start + `duration_ms`), except the
    leading ones `early` names: held first tokens (a `floor` request latency) whose floor
    falls inside this pass come out at the floor itself, not at the next pass end. `early`
    is (release time, how many of the next signals) per release, in time order; a caller
    that ignores it sees those signals at the pass end, late but never lost."""

    duration_ms: float  # modeled time of the pass, already divided by speedup
    signals: list[Signal]
    batch_size: int = 0  # requests that scheduled tokens this pass
    prefill_tokens: int = 0  # new prompt (or recompute) tokens computed this pass
    decode_requests: int = 0  # requests in the decode set (charged decode time)
    early: list[tuple[float, int]] = field(default_factory=list)


@dataclass(slots=True)
class Burst:
    """What `Scheduler.fast_forward` ran: `passes` decode passes back to back from its
    `now_ms` to `end_ms`; request `keys[i]` produced the tokens `tokens[i]` (in order)."""

    passes: int
    end_ms: float
    simulated_ms: float
    keys: list[str]
    tokens: list[list[int]]


@dataclass(frozen=True)
class EngineMetrics:
    running: int
    waiting: int
    used_blocks: int  # active blocks
    total_blocks: int
    preemptions: int
    last_batch_size: int
    last_pass_ms: float
    passes: int
    inactive_blocks: int = 0  # cached, reusable, evictable
    free_blocks: int = 0  # total - used
    evictions: int = 0
    rejected: int = 0
    completed: int = 0
    cancelled: int = 0
    alloc_stalls: int = 0  # trtllm: running request could not grow (should stay 0)
    tokens_emitted: int = 0
    prefill_tokens: int = 0  # total computed
    cached_tokens: int = 0  # total prefix-cache hits reported
    busy_ms: float = 0.0  # sum of pass durations
    recent_passes: tuple[tuple[int, float], ...] = field(default=())  # (batch size, ms), last 256


class _Req:
    """Scheduler-side state of one request."""

    __slots__ = (
        "after",
        "cached",
        "cap",
        "computed",
        "dec",
        "floor",
        "hashes",
        "key",
        "kv_present",
        "many",
        "max_out",
        "n_full",
        "n_shared",
        "pos",
        "private",
        "prompt",
        "prompt_len",
        "ready_at",
        "reported",
        "reserve",
        "sched",
        "seq",
        "state",
        "token_at",
    )

    def __init__(self, req: EngineRequest, max_out: int, reserve: int) -> None:
        self.key = req.key
        self.prompt = req.prompt
        self.prompt_len = len(req.prompt)
        self.max_out = max_out
        self.token_at = req.token_at
        self.many = getattr(req.token_at, "many", None)  # batch form (see tokens.token_deriver)
        self.pos = req.first_position  # next position to emit
        self.seq = self.prompt_len + self.pos  # known sequence length (prompt + outputs)
        self.cap = 0  # tokens the held blocks can store
        self.kv_present = req.kv_transferred
        self.ready_at = req.ready_at_ms
        self.floor = 0.0  # first token not emitted before this time (0 = no floor)
        self.after = req.first_delay_ms  # first token out this long after its pass ends
        self.reserve = reserve  # trtllm to-completion blocks
        self.computed = 0  # tokens whose KV is present
        self.hashes: list[bytes] | None = None  # prompt block hashes (lazy)
        self.n_full = 0  # full prompt blocks that get cached (0 without prefix caching)
        self.n_shared = 0  # leading prompt blocks held as cached blocks
        self.private = 0  # private blocks held
        self.cached = 0  # prefix hit tokens at first admission
        self.reported = False  # first signal sent
        self.sched = 0  # tokens scheduled in the current pass
        self.dec = False  # in the current pass: a decode step (not prefill/recompute)
        self.state = _WAITING


class Scheduler:
    """One engine's scheduler. Not thread-safe; call from one task."""

    def __init__(self, args: EngineArgs) -> None:
        self.args = args
        self._bs = args.block_size
        self._pool = KvPool(args.num_gpu_blocks)
        self._timing = TimingModel(args)
        self._vllm = args.engine_type == "vllm"
        self._caching = args.enable_prefix_caching
        self._chunked = args.enable_chunked_prefill
        self._first_decode = bool(args.first_token_decode)
        self._budget = args.max_num_batched_tokens
        self._max_seqs = args.max_num_seqs
        self._capacity = args.num_gpu_blocks * args.block_size
        self._running: list[_Req] = []
        self._waiting: deque[_Req] = deque()
        self._reqs: dict[str, _Req] = {}
        self._pending: list[Signal] = []
        #: requests whose first token is held back: key -> [floor time, held signals]
        self._held: dict[str, tuple[float, list[Signal]]] = {}
        self._floor_mode = self._timing.request_mode == "floor"
        #: first tokens of this pass to hold for `_Req.after` past its end: (key, after)
        self._after: list[tuple[str, float]] = []
        self._outstanding = 0  # trtllm: sum over running of (reserve - held)
        self._now = float("-inf")
        self._recent: deque[tuple[int, float]] = deque(maxlen=_RECENT_PASSES)
        # counters
        self._passes = 0
        self._preemptions = 0
        self._rejected = 0
        self._completed = 0
        self._cancelled = 0
        self._alloc_stalls = 0
        self._tokens = 0
        self._prefill_total = 0
        self._cached_total = 0
        self._busy_ms = 0.0
        self._last_batch = 0
        self._last_ms = 0.0

    # ---- public API ---------------------------------------------------------------------
    @property
    def timing(self) -> TimingModel:
        return self._timing

    def add(self, req: EngineRequest) -> None:
        """Queue a request. Never-fit requests are rejected by a signal on the next pass.

        Raises ValueError on a duplicate in-flight key, an empty prompt or max_output_tokens < 1.
        """
        if req.key in self._reqs:
            raise ValueError(f"request {req.key!r} is already active")
        plen = len(req.prompt)
        if plen == 0:
            raise ValueError("prompt must not be empty")
        if req.max_output_tokens < 1:
            raise ValueError("max_output_tokens must be >= 1")
        if plen >= self._capacity or (not self._chunked and plen > self._budget):
            self._rejected += 1
            self._pending.append(Signal(req.key, None, req.first_position, True, True))
            return
        if req.first_position >= req.max_output_tokens:
            self._pending.append(Signal(req.key, None, req.first_position, True))
            return
        max_out = min(req.max_output_tokens, self._capacity - plen)
        if self._vllm and not self._chunked:
            # a preempted request recomputes prompt + outputs in one pass: keep that <= budget
            max_out = min(max_out, self._budget - plen + 1)
        bs = self._bs
        r = _Req(req, max_out, -(-(plen + max_out) // bs))
        if self._floor_mode and not req.kv_transferred and r.ready_at > 0.0:
            r.floor, r.ready_at = r.ready_at, 0.0  # scheduled at once; first token held
        if self._caching:
            r.n_full = plen // bs
        self._reqs[r.key] = r
        self._waiting.append(r)

    def cancel(self, key: str) -> bool:
        """Stop a request and release its blocks. False if unknown or already finished."""
        r = self._reqs.pop(key, None)
        if r is None:
            return self._held.pop(key, None) is not None
        if r.state == _RUNNING:
            self._running.remove(r)
            self._release(r)
        else:
            self._waiting.remove(r)
        self._cancelled += 1
        return True

    def has_work(self, now_ms: float | None = None) -> bool:
        """True if a step would do something: pending signals, running or waiting requests.

        With `now_ms`, waiting requests whose ``ready_at_ms`` is still in the future do not
        count (use `next_ready_ms` to know when to wake up).
        """
        if self._pending or self._running:
            return True
        if now_ms is None:
            return bool(self._waiting or self._held)
        return (any(r.ready_at <= now_ms for r in self._waiting)
                or any(f <= now_ms for f, _ in self._held.values()))

    def next_ready_ms(self, now_ms: float | None = None) -> float | None:
        """Earliest ``ready_at_ms`` among waiting requests not yet ready at `now_ms`
        (default: the time of the last step)."""
        now = self._now if now_ms is None else now_ms
        best: float | None = None
        for r in self._waiting:
            if r.ready_at > now and (best is None or r.ready_at < best):
                best = r.ready_at
        for f, _ in self._held.values():
            if f > now and (best is None or f < best):
                best = f
        return best

    def first_ready_ms(self, now_ms: float) -> float | None:
        """Earliest ``ready_at_ms`` among waiting requests that are ready at `now_ms`, or None
        when none of them had to wait for one (every ``ready_at_ms`` is 0)."""
        best: float | None = None
        for r in self._waiting:
            if 0.0 < r.ready_at <= now_ms and (best is None or r.ready_at < best):
                best = r.ready_at
        return best

    @property
    def running_count(self) -> int:
        """Requests running (each gets one token per decode pass)."""
        return len(self._running)

    def metrics(self) -> EngineMetrics:
        pool = self._pool
        return EngineMetrics(
            running=len(self._running),
            waiting=len(self._waiting),
            used_blocks=pool.active,
            total_blocks=pool.total,
            preemptions=self._preemptions,
            last_batch_size=self._last_batch,
            last_pass_ms=self._last_ms,
            passes=self._passes,
            inactive_blocks=pool.inactive,
            free_blocks=pool.free,
            evictions=pool.evictions,
            rejected=self._rejected,
            completed=self._completed,
            cancelled=self._cancelled,
            alloc_stalls=self._alloc_stalls,
            tokens_emitted=self._tokens,
            prefill_tokens=self._prefill_total,
            cached_tokens=self._cached_total,
            busy_ms=self._busy_ms,
            recent_passes=tuple(self._recent),
        )

    # ---- the pass -----------------------------------------------------------------------
    def step(self, now_ms: float) -> PassResult:
        """Run one pass starting at `now_ms`; returns its modeled duration and the signals
        that become visible at pass end (``now_ms + duration_ms``).

        Hot path: decode steps of running requests are advanced and emitted in the first
        loop; their completion (block release) is applied after admission, as at pass end.
        """
        self._now = now_ms
        signals = self._pending
        self._pending = []
        emit = signals.append
        running = self._running
        budget = self._budget
        pending: list[_Req] = []  # prefill/admitted requests, finished at pass end
        done: list[_Req] = []
        prefill_tokens = 0
        decode_kv = 0
        n_decode = 0
        preempted = False

        # 1. running requests first. Preemption only pops requests from the end of
        # `running` (never ones already visited), so iterating the live list is safe.
        for r in running:
            if budget <= 0:
                break
            computed = r.computed
            seq = r.seq
            need = seq - computed
            if need <= 1 and computed >= r.prompt_len:  # decode step: emit now
                if seq > r.cap and not self._grow(r, seq):
                    if not self._vllm:  # guaranteed_no_evict never gets here
                        self._alloc_stalls += 1
                        continue
                    preempted = True
                    if not self._make_room(r, seq):
                        break  # r itself was the newest: preempted
                r.computed = seq
                budget -= need
                decode_kv += seq
                n_decode += 1
                if self._advance(r, seq, emit):
                    done.append(r)
                continue
            # prefill (or recompute) chunk
            if need <= budget:
                n = need
            elif self._chunked:
                n = budget
            else:
                continue
            new = computed + n
            if new > r.cap and not self._grow(r, new):
                if not self._vllm:
                    self._alloc_stalls += 1
                    continue
                preempted = True
                if not self._make_room(r, new):
                    break
            r.dec = False
            r.sched = n
            budget -= n
            prefill_tokens += n
            pending.append(r)
        n_batch = n_decode + len(pending)

        # 2. then waiting requests, FIFO
        waiting = self._waiting
        if waiting and not preempted:
            deferred: list[_Req] = []
            max_seqs = self._max_seqs
            while waiting and budget > 0 and len(running) < max_seqs:
                r = waiting[0]
                if r.ready_at > now_ms:
                    deferred.append(waiting.popleft())
                    continue
                n = self._try_admit(r, budget)
                if n < 0:
                    break
                waiting.popleft()
                r.state = _RUNNING
                running.append(r)
                if r.dec:
                    decode_kv += r.seq
                    n_decode += 1
                else:
                    prefill_tokens += n
                budget -= n
                n_batch += 1
                pending.append(r)
            if deferred:
                waiting.extendleft(reversed(deferred))

        # 3. pass end for prefill chunks and admitted requests
        first_decode = self._first_decode
        pairs = 0.0  # prefill attention's query-key pairs (the linear timing model)
        for r in pending:
            if not r.dec:
                pairs += prefill_pairs(r.sched, r.computed)
            r.computed += r.sched
            if r.n_shared < r.n_full:
                self._register(r)
            seq = r.seq
            if r.computed != seq:
                continue  # prefill chunk still incomplete
            if first_decode and not r.dec and r.max_out != 1:
                decode_kv += seq  # the first token is a decode step of this pass
                n_decode += 1
            if self._advance(r, seq, emit):
                done.append(r)

        emitted = len(signals)
        if done:
            reqs = self._reqs
            for r in done:
                r.state = _DONE
                del reqs[r.key]
                self._release(r)
            self._completed += len(done)
            self._running = [r for r in running if r.state == _RUNNING]

        # A pass that schedules nothing (every waiting request still on its way: a per-request
        # latency, a KV transfer) is not run, so it takes no time: charged the per-pass
        # constant, it would move the clock on in steps of it and admit a request that became
        # ready in between up to that much late.
        duration = (self._timing.pass_ms(prefill_tokens, pairs, n_batch, n_decode, decode_kv)
                    if n_batch else 0.0)
        early: list[tuple[float, int]] = []
        if self._after:
            end = now_ms + duration
            for key, after in self._after:
                self._held[key] = (end + after, self._held[key][1])
            self._after.clear()
        if self._held:
            signals = self._hold_back(signals, now_ms, now_ms + duration, early)
        self._passes += 1
        self._tokens += emitted
        self._prefill_total += prefill_tokens
        self._busy_ms += duration
        self._last_batch = n_batch
        self._last_ms = duration
        self._recent.append((n_batch, duration))
        return PassResult(duration, signals, n_batch, prefill_tokens, n_decode, early)

    def fast_forward(self, now_ms: float, until_ms: float, max_tokens: int) -> Burst:
        """Run up to ``max(1, max_tokens // running)`` consecutive passes starting at
        `now_ms` (so about `max_tokens` tokens of work at most), each one only if it ENDS by
        `until_ms`, and only while a pass is a plain decode step of every running request:
        nothing waiting or pending, every running request decode-ready and already reported,
        none finishing in it. Stops (possibly after 0 passes) at the first pass that is
        anything else; the caller runs that one with `step`.

        Equivalent to calling `step` for each of those passes (same tokens, KV allocations in
        the same order, timing, metrics, also between calls), minus the per-pass `Signal` and
        `PassResult` objects, and each request's tokens are derived in one tight loop. The
        engine loop uses it to catch up when it is behind schedule (speedup 1000 or 0), where
        the per-pass overhead of `step` with a handful of running requests dominates.
        """
        running = self._running
        keys = [r.key for r in running]
        n = len(running)
        if self._pending or self._waiting or self._held or not n or n > self._budget:
            return Burst(0, now_ms, 0.0, keys, [[] for _ in running])
        # Every pass adds one token to each request: limits are known up front.
        limit = max(1, max_tokens // n)
        kv = 0
        room = 1 << 62  # passes before some request needs another block
        for r in running:
            seq = r.seq
            if seq - r.computed > 1 or r.computed < r.prompt_len or not r.reported:
                return Burst(0, now_ms, 0.0, keys, [[] for _ in running])
            left = r.max_out - 1 - r.pos  # passes before its finishing one
            if left < limit:
                limit = left
            if r.cap - seq < room:
                room = r.cap - seq
            kv += seq
        decode_ms = self._timing.decode_pass_fn(n)
        recent = self._recent
        pool = self._pool
        bs = self._bs
        busy = self._busy_ms
        t = now_ms
        last = 0.0
        passes = 0
        # Phase 1: pace the passes and make their KV allocations, pass by pass (the pool
        # sees the same operations in the same order as from `step`).
        while passes < limit:
            duration = decode_ms(kv)
            if t + duration > until_ms:
                break
            if room < 0:
                # Allocate only if every request that needs a block this pass gets it;
                # otherwise leave the pass (and its allocation failure) to `step`.
                growing = [r for r in running if r.seq + passes > r.cap]
                need = sum([-(-(r.seq + passes) // bs) - r.n_shared - r.private for r in growing])
                if need > pool.free:
                    break
                for r in growing:
                    self._grow(r, r.seq + passes)
                room = min([r.cap - r.seq for r in running]) - passes
            recent.append((n, duration))
            busy += duration
            last = duration
            self._now = t
            t = t + duration
            kv += n
            room -= 1
            passes += 1
        if not passes:
            return Burst(0, now_ms, 0.0, keys, [[] for _ in running])
        # Phase 2: advance each request by `passes` positions and derive its tokens.
        outs: list[list[int]] = []
        for r in running:
            pos = r.pos
            many = r.many
            outs.append(
                many(pos, passes)
                if many is not None
                else [r.token_at(p) for p in range(pos, pos + passes)]
            )
            r.pos = pos + passes
            r.seq += passes
            r.computed = r.seq - 1
        self._passes += passes
        self._tokens += n * passes
        self._busy_ms = busy
        self._last_batch = n
        self._last_ms = last
        return Burst(passes, t, t - now_ms, keys, outs)

    # ---- helpers ------------------------------------------------------------------------
    def _advance(self, r: _Req, seq: int, emit: Callable[[Signal], None]) -> bool:
        """Emit `r`'s next token now that this pass computed KV position `seq`; True when it
        was the request's last token.

        Called once per token by both a decode step and a finished prefill. Against the same
        lines inlined in the decode loop it costs 3.6% more instructions per pass (callgrind,
        256 running sequences: 12.2k vs 11.8k per sequence), about 1% of the engine's CPU per
        token; one definition is worth that."""
        pos = r.pos
        r.pos = pos + 1
        r.seq = seq + 1
        fin = pos + 1 >= r.max_out
        if r.reported:
            emit(Signal(r.key, r.token_at(pos), pos, fin))
        else:
            self._first_signal(r, pos, fin, emit)
        return fin

    def _hold_back(self, signals: list[Signal], start_ms: float, end_ms: float,
                   early: list[tuple[float, int]]) -> list[Signal]:
        """This pass's visible signals. Tokens held from earlier passes whose floor comes by
        `end_ms` lead, released at the floor itself (one `early` entry per floor, in time
        order, none before `start_ms`); this pass's signals of requests whose floor is still
        ahead are held; the rest, with this pass's first tokens whose floor has come, are
        visible at `end_ms`.
        A held first token comes out when the target's path lets it go (Dynamo's: the
        delayed ACK's timer, docs/fidelity.md), not at the engine's next pass end."""
        held = self._held
        out: list[Signal] = []
        due = sorted((f, k) for k, (f, sigs) in held.items() if f <= end_ms and sigs)
        for f, k in due:
            sigs = held.pop(k)[1]
            early.append((max(f, start_ms), len(sigs)))
            out.extend(sigs)
        for s in signals:
            h = held.get(s.key)
            if h is None:
                out.append(s)
            else:
                h[1].append(s)
        for key in [k for k, (f, _) in held.items() if f <= end_ms]:
            out.extend(held.pop(key)[1])
        return out

    def _first_signal(
        self, r: _Req, pos: int, fin: bool, emit: Callable[[Signal], None]
    ) -> None:
        if r.floor > 0.0:
            self._held[r.key] = (r.floor, [])
        elif r.after > 0.0:
            # its release time is known once the pass's duration is (`step`)
            self._held[r.key] = (float("inf"), [])
            self._after.append((r.key, r.after))
        r.reported = True
        self._cached_total += r.cached
        emit(Signal(r.key, r.token_at(pos), pos, fin, False, r.cached))

    def _grow(self, r: _Req, tokens: int) -> bool:
        """Allocate blocks so `r` can hold `tokens` tokens of KV; False if the pool is full."""
        bs = self._bs
        extra = -(-tokens // bs) - r.n_shared - r.private
        if not self._pool.alloc_private(extra):
            return False
        r.private += extra
        r.cap = (r.n_shared + r.private) * bs
        self._outstanding -= extra
        return True

    def _make_room(self, r: _Req, tokens: int) -> bool:
        """vllm: preempt the newest running requests until `r` can grow to `tokens`.
        False if `r` itself had to be preempted."""
        running = self._running
        while True:
            victim = running[-1]
            self._preempt(victim)
            if victim is r:
                return False
            if self._grow(r, tokens):
                return True

    def _try_admit(self, r: _Req, budget: int) -> int:
        """Admit `r` and allocate its blocks for this pass; tokens scheduled, or -1 to wait."""
        pool = self._pool
        bs = self._bs
        plen = r.prompt_len
        seq = r.seq
        matched = active = 0
        if self._caching:
            if r.hashes is None:
                r.hashes = block_hashes(r.prompt, bs)
            matched, active = pool.lookup(r.hashes, r.n_full)
        if self._vllm:
            # vLLM's hit is whole blocks within seq - 1 (a prompt cached to its last block
            # recomputes that block, not just its last token: KVCacheManager.get_computed_blocks)
            matched = min(matched, (seq - 1) // bs)
            active = min(active, matched)
            hit = matched * bs
        else:
            hit = min(matched * bs, seq - 1)
        computed = plen if r.kv_present else hit
        if self._vllm:
            if -(-seq // bs) - active > pool.free:
                return -1
        elif r.reserve - active > pool.free - self._outstanding:
            return -1
        need = seq - computed
        if need <= budget:  # budget > 0, so a decode step always fits
            n = need
        elif self._chunked:
            n = budget
        else:
            return -1
        extra = -(-(computed + n) // bs) - matched
        if matched:
            pool.acquire(r.hashes[:matched])  # type: ignore[index]
        if not pool.alloc_private(extra):  # cannot happen after the checks above
            if matched:
                pool.release(r.hashes[:matched])  # type: ignore[index]
            return -1
        r.n_shared = matched
        r.private = extra
        r.cap = (matched + extra) * bs
        r.computed = computed
        r.dec = need <= 1 and computed >= plen
        r.sched = n
        if not r.reported:
            r.cached = hit
        if not self._vllm:
            self._outstanding += r.reserve - matched - extra
        return n

    def _register(self, r: _Req) -> None:
        """Cache the prompt blocks `r` completed this pass (private -> shared)."""
        full = min(r.computed, r.prompt_len) // self._bs
        if full > r.n_full:
            full = r.n_full
        hashes = r.hashes
        if hashes is None:
            hashes = r.hashes = block_hashes(r.prompt, self._bs)
        pool = self._pool
        k = r.n_shared
        while k < full:
            pool.register(hashes[k], hashes[k - 1] if k else ROOT_HASH)
            r.private -= 1
            k += 1
        r.n_shared = k

    def _release(self, r: _Req) -> None:
        pool = self._pool
        if r.n_shared:
            pool.release(r.hashes[: r.n_shared])  # type: ignore[index]
        pool.free_private(r.private)
        if not self._vllm:
            self._outstanding -= r.reserve - r.n_shared - r.private
        r.n_shared = 0
        r.private = 0
        r.cap = 0

    def _preempt(self, r: _Req) -> None:
        """vllm LIFO preemption with recompute: r is the last running request."""
        self._running.pop()
        self._release(r)
        r.computed = 0
        r.kv_present = False  # the transferred KV is gone: recompute
        r.state = _WAITING
        self._waiting.appendleft(r)
        self._preemptions += 1
