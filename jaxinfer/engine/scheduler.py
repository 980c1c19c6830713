"""Scheduler: continuous batching over a paged KV cache, vLLM v1 style (plain Python, never imports jax).

The scheduler speaks tokens, not phases. Each request has num_computed_tokens catching up to num_tokens
(= prompt + outputs). Every step it hands out up to max_num_batched_tokens tokens:

  1. running requests, in order: n = num_tokens - num_computed_tokens (1 for a decode, the rest of the
     prompt for an unfinished prefill), capped by the remaining budget (chunked prefill) and by
     long_prefill_token_threshold. If its pages cannot be allocated, the most recently started running
     request (the last in running order, possibly this one) is preempted — pages freed,
     num_computed_tokens = 0, put at the FRONT of the waiting queue, outputs kept (it recomputes
     prompt + outputs when readmitted) — and the allocation is retried.
  2. if nothing was preempted this step: waiting requests in FIFO order while budget > 0,
     len(running) < max_num_seqs and their pages can be allocated; the first one that does not fit stops
     admission (no skipping ahead).

Protocol: out = schedule(); run the model on out.scheduled; update(out, sampled). schedule() advances
num_computed_tokens itself, so update() may lag one schedule() behind (pipelining), in order. abort()/finish()
may be called at any time (also between schedule and update: update then skips that request).

Prefix caching (when kv.enable_prefix_caching): a request admitted from waiting (new, or re-admitted after
preemption) first looks up the longest chain of cached full pages of its known tokens and takes them
(num_computed_tokens starts at the hit), capped at (num_tokens - 1) // page_size pages so at least one token
is computed (the last one must run to produce logits). Pages become cacheable in update(), i.e. once the step
that computed them has come back: for every seq of the finished step whose request is still running, the
full pages below start_pos + n (all of those token ids are known by then) are registered. Registering at
schedule() time is not possible with pipelining (the last token of a chunk may be a placeholder whose id is
unknown until the previous step's update()), and registering only after the step came back is the
conservative rule: a page is never offered to another request before its KV is known to be written (a
request aborted or preempted before its step returns registers nothing). Nothing is ever written into a
cached page: hits are whole pages and the computed rest goes into fresh pages (ref count 1, no hash).

Speculative decoding: the engine puts draft tokens on a decode-ready running request (all its tokens known,
num_computed_tokens = num_tokens - 1) right before schedule(). Such a request is scheduled as ONE chunk of
1 + k tokens — its last token plus the k drafts, positions num_tokens-1 .. num_tokens-1+k — in the same batch as
everything else, with sample=True; the device verifies the drafts and returns 1..k+1 tokens. update() then
rolls num_computed_tokens back to the accepted length (KV slots of rejected drafts are simply overwritten
later) and releases pages that held only rejected drafts, before registering any page in the prefix cache (so
no page hash ever covers a rejected token). Drafts are trimmed so the chunk stays within max_model_len and the
request's max_tokens, and to the step's token budget; drafts not consumed by this schedule() are dropped.
Pipelined speculation (engine/spec_pipeline.py) also gives drafts (placeholders, filled on the device) to a request
whose last token is still pending, with num_pending_tokens counting the worst case of the step in flight.

No deadlock: add_request rejects any request whose whole lifetime (prompt + max_tokens, or max_model_len
when max_tokens is None) does not fit an empty cache, and waiting requests hold no pages, so the oldest
running request can always allocate by preempting the others, and with nothing running the head of the
waiting queue always fits.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from . import decode_run
from .decode_run import DecodeRun
from .kv_cache import KVCacheManager
from .request import Request, RequestStatus

_SPEC = decode_run._SPEC


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ is several times slower (one per seq per step)
class ScheduledSeq:
    """One request's work this step: compute `token_ids` at positions start_pos .. start_pos+n-1."""

    request_id: str
    token_ids: list[int]      # all_token_ids[start_pos : start_pos + n], n >= 1
    start_pos: int            # = num_computed_tokens when scheduled
    page_table: list[int]     # all pages of the request after allocation; covers start_pos + n tokens
    sample: bool              # True iff the chunk ends at the last token -> sample a new token
    is_prefill: bool          # n > 1 or first chunk (start_pos == 0)
    # Pipelining: the last `num_placeholders` entries of token_ids are -1 — tokens the previous step (still in
    # flight) is sampling; the runner takes them from that step's device output. 0 when nothing is in flight.
    num_placeholders: int = 0
    output_index: int = 0     # index (in the request's outputs) of the token this chunk samples
    num_spec_tokens: int = 0  # speculative decoding: the last num_spec_tokens of token_ids are draft tokens
    # The Request scheduled (None only for hand-built ones): update() and the engine apply results only to this
    # object, never to a later request that reuses the id (abort + re-add while the step is in flight).
    request: Request | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


class SchedulerOutput:
    """What one schedule() hands out. `scheduled` is the batch in order: the rows of `decodes` (steady decodes
    as columns, engine/decode_run.py; made into ScheduledSeqs only when something reads `scheduled`) and then
    `seqs` (the ScheduledSeqs of everything else)."""

    def __init__(self, scheduled: list[ScheduledSeq], preempted_ids: list[str], num_batched_tokens: int,
                 finished_ids: list[str] | None = None, decodes: DecodeRun | None = None):
        self.seqs = scheduled
        self.decodes = decodes if decodes is not None and len(decodes) else None
        self.preempted_ids = preempted_ids            # preempted during this schedule() (none is scheduled)
        self.num_batched_tokens = num_batched_tokens  # sum of len(token_ids) over `scheduled`
        self.finished_ids = [] if finished_ids is None else finished_ids  # finished/aborted since the last one
        self._scheduled = None if self.decodes is not None else scheduled

    @property
    def scheduled(self) -> list[ScheduledSeq]:
        if self._scheduled is None:
            self._scheduled = self.decodes.materialize(ScheduledSeq) + self.seqs
        return self._scheduled

    @property
    def is_empty(self) -> bool:
        return not self.seqs and self.decodes is None

    def replaced(self, scheduled: list[ScheduledSeq]) -> "SchedulerOutput":
        """The same output with another batch (all ScheduledSeqs; num_batched_tokens recounted)."""
        return SchedulerOutput(scheduled, self.preempted_ids, sum(len(q.token_ids) for q in scheduled),
                               self.finished_ids)


@dataclass(frozen=True)
class SchedulerStats:
    num_running: int
    num_waiting: int
    num_free_pages: int
    num_used_pages: int
    num_preemptions_total: int
    # prefix cache (counted once per admission that looked the cache up): tokens looked up and tokens hit
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prefix_cache_hit_requests: int = 0   # admissions with a hit of at least one page
    num_cached_pages: int = 0            # pages holding a registered hash (in use or evictable)

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0


_FINISH_STATUS = {
    "stop": RequestStatus.FINISHED_STOPPED,
    "length": RequestStatus.FINISHED_LENGTH,
    "abort": RequestStatus.FINISHED_ABORTED,
}


class Scheduler:
    def __init__(self, kv: KVCacheManager, max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int,
                 eos_token_ids: set[int] | None = None, long_prefill_token_threshold: int | None = None) -> None:
        for name, v in (("max_num_batched_tokens", max_num_batched_tokens), ("max_num_seqs", max_num_seqs),
                        ("max_model_len", max_model_len)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r} must be an int >= 1")
        if long_prefill_token_threshold is not None and (
                not isinstance(long_prefill_token_threshold, int) or long_prefill_token_threshold < 1):
            raise ValueError(f"long_prefill_token_threshold={long_prefill_token_threshold!r} must be None (off) "
                             f"or an int >= 1")
        self.kv = kv
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids or ())
        self.long_prefill_token_threshold = long_prefill_token_threshold

        self.waiting: deque[Request] = deque()   # FIFO; preempted requests go to the front; hold no pages
        self.running: list[Request] = []         # start order; the last one is preempted first
        self._requests: dict[str, Request] = {}  # all unfinished requests (waiting + running)
        self._next_arrival = 0
        self._num_preemptions_total = 0
        self._finished_ids: list[str] = []       # since the previous schedule()
        self._update_finished: dict[str, Request] = {}  # finished by the latest update() (finish_by_stop_string)
        self._pc_queries = 0                     # prefix cache: tokens looked up at admission
        self._pc_hits = 0                        # prefix cache: tokens found cached at admission
        self._pc_hit_requests = 0
        # steady decode steps as columns (engine/decode_run.py); False: the general loop for every step (tests
        # compare the two)
        self.columnar = True
        self.min_decode_run = decode_run.MIN_RUN  # (tests lower it to 1)
        # The decode run's chain (decode_run.py): the run the latest schedule() made (None: none), and the run whose
        # tokens the latest update() gave to all its rows (None: that update did anything else)
        self._last_run: DecodeRun | None = None
        self._applied: DecodeRun | None = None

    # ---- admission ---------------------------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        """Queue a request (FIFO). ValueError if it could never run: too long for max_model_len or the cache."""
        rid = req.request_id
        if rid in self._requests:
            raise ValueError(f"request {rid!r} is already queued or running; request ids must be unique")
        if req.status is not RequestStatus.WAITING or req.num_computed_tokens != 0:
            raise ValueError(f"request {rid!r} must be new (status WAITING, num_computed_tokens 0), got "
                             f"status {req.status.name}, num_computed_tokens {req.num_computed_tokens}")
        p = req.num_prompt_tokens
        if p == 0:
            raise ValueError(f"request {rid!r} has an empty prompt; pass at least one prompt token")
        mt = req.max_tokens
        if mt is not None:
            total = p + mt
            what = f"prompt {p} + max_tokens {mt}"
            if total > self.max_model_len:
                raise ValueError(f"request {rid!r} needs {total} tokens ({what}) but max_model_len is "
                                 f"{self.max_model_len}; shorten the prompt or lower max_tokens")
        else:
            # max_tokens=None: generate until the context window is full.
            total = self.max_model_len
            what = f"prompt {p}, max_tokens=None runs to max_model_len {self.max_model_len}"
            if p >= self.max_model_len:
                raise ValueError(f"request {rid!r} has a prompt of {p} tokens but max_model_len is "
                                 f"{self.max_model_len}, leaving no room to generate; shorten the prompt")
        if not self.kv.can_fit_ever(total):
            usable, ps = self.kv.num_usable_pages, self.kv.page_size
            raise ValueError(f"request {rid!r} needs {self.kv.pages_needed(total)} KV pages ({total} tokens: "
                             f"{what}) but the cache has only {usable} usable pages of {ps} tokens "
                             f"({usable * ps} tokens); raise gpu_memory_utilization/num_pages or shorten "
                             f"the request")
        # the output count at which it ends by length (max_tokens or max_model_len): the stop checks' first test
        req.output_limit = self.max_model_len - p if mt is None else min(mt, self.max_model_len - p)
        req.arrival_index = self._next_arrival
        self._next_arrival += 1
        self._requests[rid] = req
        self.waiting.append(req)

    # ---- one step ----------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        scheduled: list[ScheduledSeq] = []
        preempted: list[str] = []
        # 1. running requests first, in start order: as columns when they are all steady decodes
        run = decode_run.schedule_steady(self, self.max_num_batched_tokens) if self.columnar else None
        self._last_run = run
        if run is not None:
            budget = self.max_num_batched_tokens - len(run)
        else:
            budget = self._schedule_running(self.max_num_batched_tokens, scheduled, preempted)

        # 2. admit waiting requests FIFO (not in a step that preempted: the pages are too tight).
        if not preempted:
            while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
                req = self.waiting[0]
                hit_pages = self._lookup(req)
                hit = len(hit_pages) * self.kv.page_size
                n = self._chunk(req, budget, start=hit)
                assert n > 0, f"waiting {req!r} has nothing to compute"
                if self.kv.allocate(req.request_id, hit + n, cached_pages=hit_pages) is None:
                    break  # FIFO fairness: never skip the head
                self.waiting.popleft()
                req.num_computed_tokens = hit
                if self.kv.enable_prefix_caching and req.use_prefix_cache:
                    self._pc_queries += req.num_tokens
                    self._pc_hits += hit
                    self._pc_hit_requests += hit > 0
                req.status = RequestStatus.RUNNING
                self.running.append(req)
                scheduled.append(self._make_seq(req, n))
                budget -= n

        if any(map(_SPEC, self.running)):  # drafts belong to this step's token state: never reuse them later
            for req in self.running:
                if req.spec_token_ids:
                    req.spec_token_ids = []
        finished_ids, self._finished_ids = self._finished_ids, []
        return SchedulerOutput(scheduled, preempted, self.max_num_batched_tokens - budget, finished_ids, run)

    def _schedule_running(self, budget: int, scheduled: list[ScheduledSeq], preempted: list[str]) -> int:
        """Step 1 of schedule(): a chunk for each running request in start order while budget lasts, appended to
        `scheduled` (preempted ids to `preempted`). Returns the budget left.

        The common case (a decode or prefill chunk whose pages are already held, no drafts) is inlined: this loop
        runs for every running request every step. _chunk, _reached_length, _allocate_or_preempt and _make_seq
        are its general form and must agree with it (tests/engine/test_scheduler_fast_path.py runs both)."""
        running = self.running
        page_lists = self.kv.page_lists
        page_size = self.kv.page_size
        max_len = self.max_model_len
        lpt = self.long_prefill_token_threshold
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            pending = req.num_pending_tokens
            num_outputs = len(req.output_token_ids)
            num_prompt = len(req.prompt_token_ids)
            if pending:  # _reached_length: the token in flight is its last one -> nothing more to compute
                outputs = num_outputs + pending
                mt = req.max_tokens
                if (mt is not None and outputs >= mt) or num_prompt + outputs >= max_len:
                    i += 1
                    continue
            start = req.num_computed_tokens
            num_tokens = num_prompt + num_outputs
            n = num_tokens + pending - start
            if n > budget:
                n = budget
            if lpt is not None and n > lpt:
                n = lpt
            if n <= 0:  # nothing to compute (only if update() was not given its sampled token)
                i += 1
                continue
            if req.spec_token_ids:
                spec = self._drafts(req, n, budget)
                if spec:
                    n += len(spec)
                    if not self._allocate_or_preempt(req, n, preempted):
                        break  # req was the last running request and preempted itself
                    scheduled.append(self._make_seq(req, n, spec))
                    budget -= n
                    i += 1
                    continue
            rid = req.request_id
            pages = page_lists.get(rid)
            if pages is None or start + n > len(pages) * page_size:
                if not self._allocate_or_preempt(req, n, preempted):
                    break
                pages = page_lists[rid]
            # _make_seq without drafts
            end = start + n
            sample = end == num_tokens + pending
            if end <= num_tokens:
                token_ids = req.token_slice(start, end)
                placeholders = 0
            elif start >= num_tokens:  # a pipelined decode: its token(s) are still being sampled
                placeholders = end - start
                token_ids = [-1] * placeholders
            else:
                placeholders = end - num_tokens
                token_ids = req.token_slice(start, num_tokens) + [-1] * placeholders
            scheduled.append(ScheduledSeq(rid, token_ids, start, list(pages), sample, n > 1 or start == 0,
                                          placeholders, num_outputs + pending, 0, req))
            req.num_computed_tokens = end
            if sample:
                req.num_pending_tokens = pending + 1
            budget -= n
            i += 1
        return budget

    def _lookup(self, req: Request) -> list[int]:
        """Cached pages for the start of a waiting request (which holds no pages and has no token in flight).
        At most (num_tokens - 1) // page_size pages: the last token is always computed, in a page of its own."""
        if not (self.kv.enable_prefix_caching and req.use_prefix_cache):
            return []
        return self.kv.lookup(req.page_hashes, req.token_slice, (req.num_tokens - 1) // self.kv.page_size)

    def _chunk(self, req: Request, budget: int, start: int | None = None) -> int:
        if self._reached_length(req):
            return 0  # the token in flight is its last one: nothing more to compute
        if start is None:
            start = req.num_computed_tokens
        # = req.num_tokens_with_pending - start, without the property (every running request, every step)
        n = min(len(req.prompt_token_ids) + len(req.output_token_ids) + req.num_pending_tokens - start, budget)
        if self.long_prefill_token_threshold is not None:
            n = min(n, self.long_prefill_token_threshold)
        return n

    def _drafts(self, req: Request, n: int, budget: int) -> list[int]:
        """The draft tokens to verify with req's decode this step (possibly trimmed), or []."""
        spec = req.spec_token_ids
        # Pipelined speculation (engine/spec_pipeline.py): the last token may be pending and the drafts placeholders.
        n_all = req.num_tokens_with_pending
        if not spec or n != 1 or req.num_computed_tokens != n_all - 1:
            return []
        k = min(len(spec), budget - 1, self.max_model_len - n_all)
        if req.max_tokens is not None:
            # the bonus token is the max_tokens-th
            k = min(k, req.max_tokens - req.num_output_tokens - req.num_pending_tokens - 1)
        return list(spec[:max(k, 0)])

    def _allocate_or_preempt(self, req: Request, n: int, preempted: list[str]) -> bool:
        """Allocate pages for req's next n tokens, preempting from the back of `running` as needed.
        False iff req itself got preempted (it was the last running request)."""
        while self.kv.allocate(req.request_id, req.num_computed_tokens + n) is None:
            victim = self.running.pop()
            self._preempt(victim)
            preempted.append(victim.request_id)
            if victim is req:
                return False
        return True

    def _preempt(self, req: Request) -> None:
        self.kv.free(req.request_id)
        req.num_computed_tokens = 0           # recompute prompt + outputs (outputs are kept)
        req.num_pending_tokens = 0            # a token sampled in flight is dropped; it is sampled again later
        req.spec_token_ids = []
        req.status = RequestStatus.PREEMPTED
        req.num_preemptions += 1
        self._num_preemptions_total += 1
        self.waiting.appendleft(req)

    def _reached_length(self, req: Request) -> bool:
        """True if the tokens known plus pending already hit max_tokens or max_model_len."""
        pending = req.num_pending_tokens
        if not pending:
            return False
        # lengths read directly, not through Request's properties: this runs for every running request every step
        outputs = len(req.output_token_ids) + pending
        mt = req.max_tokens
        return (mt is not None and outputs >= mt) or len(req.prompt_token_ids) + outputs >= self.max_model_len

    def _make_seq(self, req: Request, n: int, spec: list[int] = ()) -> ScheduledSeq:
        """Schedule tokens [start, start+n) of req and advance its counters now (not at update), so the next
        schedule() can run while this step is still on the device. spec: draft tokens, the last len(spec) of
        the n (a speculative chunk always samples)."""
        start = req.num_computed_tokens
        k = len(spec)
        num_outputs = len(req.output_token_ids)  # (lengths read directly: once per request per step)
        num_tokens = len(req.prompt_token_ids) + num_outputs
        end = start + n - k  # end of the non-draft tokens
        known_end = max(start, min(end, num_tokens))  # (pipelined speculation: start may pass the known tokens)
        placeholders = end - known_end
        sample = end == num_tokens + req.num_pending_tokens
        if known_end == start and not k:  # a pipelined decode: its one token is still being sampled
            token_ids = [-1] * placeholders
        else:
            token_ids = req.token_slice(start, known_end)
            if placeholders or k:
                token_ids = token_ids + [-1] * placeholders + list(spec)
        # positional: request_id, token_ids, start_pos, page_table, sample, is_prefill, num_placeholders,
        # output_index, num_spec_tokens, request (keywords cost ~0.3 µs more per call, once per request per step)
        seq = ScheduledSeq(req.request_id, token_ids, start, self.kv.page_table(req.request_id), sample,
                           n - k > 1 or start == 0, placeholders, num_outputs + req.num_pending_tokens, k, req)
        req.num_computed_tokens += n
        if sample:
            req.num_pending_tokens += 1
        return seq

    def update(self, output: SchedulerOutput, sampled: dict[str, list[int]],
               run_tokens: list[int] | None = None) -> list[Request]:
        """Apply a finished step: advance num_computed_tokens, append sampled tokens, check stops.

        sampled[request_id] is the list of new tokens (one normally; several with speculative decoding)
        for every seq with sample=True; entries for other seqs are ignored. Requests aborted/finished/preempted
        since schedule() are skipped. Tokens after a stop are dropped. Returns the requests finished here.
        num_computed_tokens was already advanced by schedule(); update() may lag one schedule() behind
        (pipelining), but outputs must be applied in schedule order.

        run_tokens: the sampled token of each row of output.decodes, in row order (the engine's columnar form;
        rows whose request has left are ignored); then `sampled` needs entries only for output.seqs. Without it
        every row is read from `sampled`.
        """
        run = output.decodes if run_tokens is not None else None
        seqs = output.seqs if run is not None else output.scheduled
        live = []
        running = RequestStatus.RUNNING
        for seq in seqs:  # validate everything first so a bad call changes nothing
            req = self._requests.get(seq.request_id)
            if req is None or req.status is not running or (seq.request is not None and seq.request is not req):
                continue  # ended since schedule() (its id may have been reused by a new request since)
            if seq.sample and seq.output_index != len(req.output_token_ids):
                raise RuntimeError(f"request {seq.request_id!r}: update() got the sample for output {seq.output_index} "
                                   f"but the request has {req.num_output_tokens} outputs; call update() exactly "
                                   f"once per schedule(), in order")
            if seq.sample and not sampled.get(seq.request_id):
                raise ValueError(f"request {seq.request_id!r} was scheduled with sample=True but sampled has no "
                                 f"token for it; pass sampled[{seq.request_id!r}] = [token_id, ...]")
            if seq.num_spec_tokens and len(sampled[seq.request_id]) > seq.num_spec_tokens + 1:
                raise ValueError(f"request {seq.request_id!r} got {len(sampled[seq.request_id])} tokens from a step "
                                 f"that verified {seq.num_spec_tokens} draft tokens; at most "
                                 f"{seq.num_spec_tokens + 1} (accepted drafts + one) can come back")
            live.append((seq, req))
        if run is not None:
            if len(run_tokens) != len(run):
                raise ValueError(f"run_tokens has {len(run_tokens)} tokens for the {len(run)} rows of output.decodes")
            run_live = decode_run.live_rows(self, run)
        self._applied = None  # (from here on the requests change; decode_run.update_run sets it)

        for seq, req in live:
            if seq.num_spec_tokens:
                # Roll back past the rejected drafts: their KV slots are overwritten by later steps; pages that
                # held only rejected drafts go back to the pool. Done before any prefix-cache registration.
                rejected = seq.num_spec_tokens + 1 - len(sampled[seq.request_id])
                req.num_computed_tokens -= rejected
                self.kv.truncate(req.request_id, req.num_computed_tokens)

        if self.kv.enable_prefix_caching:
            # The step is done: its tokens' KV is written, and every token id below the end of its chunks is
            # known (a placeholder was filled by the previous update()). Register the full pages. A request
            # preempted/aborted/finished since schedule() is not in `live`: nothing of it is registered.
            if run is not None:  # (the run is the front of the batch: its rows first)
                decode_run.cache_run_pages(self, run, run_live)
            ps = self.kv.page_size
            for seq, req in live:
                end = seq.start_pos + len(seq.token_ids)
                if end // ps == seq.start_pos // ps:
                    continue  # fast path (most decodes): this chunk filled no page
                end = min(end, req.num_tokens, req.num_computed_tokens)
                self.kv.cache_pages(req.request_id, req.page_hashes, req.token_slice, end // ps)

        finished: list[Request] = []
        self._update_finished = {}
        if run is not None:
            decode_run.update_run(self, run, run_live, run_tokens, finished)
        eos = self.eos_token_ids
        for seq, req in live:
            if not seq.sample:
                continue
            req.num_pending_tokens -= 1
            outputs = req.output_token_ids
            # a token can end the request only if it is a stop / eos id or reaches a length limit; only then is
            # _check_stop (which says how) called: most tokens of most requests pass these cheap tests
            limit = req.output_limit
            for tok in sampled[seq.request_id]:
                tok = int(tok)
                outputs.append(tok)
                if len(outputs) < limit and tok not in req.stop_token_ids and (req.ignore_eos or tok not in eos):
                    continue
                if self._end_if_stopped(req, tok, finished):
                    break  # tokens after a stop are dropped
        return finished

    def _end_if_stopped(self, req: Request, tok: int, finished: list[Request]) -> bool:
        """After the cheap tests flagged `tok` (just appended to req's outputs; update() and decode_run.update_run):
        end req if the token stops it (appended to `finished`). True if it did."""
        stop = self._check_stop(req, tok)
        if stop is None:
            return False
        self._finish(req, *stop)
        finished.append(req)
        self._update_finished[req.request_id] = req
        return True

    def _check_stop(self, req: Request, tok: int) -> tuple[RequestStatus, int | None] | None:
        num_outputs = len(req.output_token_ids)  # (not the properties: once per request per step)
        if num_outputs >= req.min_tokens:
            if tok in req.stop_token_ids:
                return RequestStatus.FINISHED_STOPPED, tok
            if not req.ignore_eos and tok in self.eos_token_ids:
                return RequestStatus.FINISHED_STOPPED, None  # vLLM: stop_reason None means eos
        mt = req.max_tokens
        if mt is not None and num_outputs >= mt:
            return RequestStatus.FINISHED_LENGTH, None
        if len(req.prompt_token_ids) + num_outputs >= self.max_model_len:
            return RequestStatus.FINISHED_LENGTH, None
        return None

    # ---- ending requests from outside --------------------------------------------------------------
    def abort(self, request_id: str) -> Request | None:
        """Abort a waiting or running request; frees its pages. Returns it, or None if unknown/finished."""
        req = self._requests.get(request_id)
        if req is None:
            return None
        self._finish(req, RequestStatus.FINISHED_ABORTED, None)
        return req

    def finish(self, request_id: str, reason: str = "stop", stop_reason: int | str | None = None) -> Request | None:
        """End a request for a reason found outside the scheduler (e.g. the detokenizer matched stop string
        `stop_reason`). reason: 'stop' | 'length' | 'abort'. Returns it, or None if unknown/finished."""
        status = _FINISH_STATUS.get(reason)
        if status is None:
            raise ValueError(f"reason={reason!r} must be one of {sorted(_FINISH_STATUS)}")
        req = self._requests.get(request_id)
        if req is None:
            return None
        self._finish(req, status, stop_reason)
        return req

    def finish_by_stop_string(self, request_id: str, stop: str, keep_tokens: int) -> Request | None:
        """End a request whose text matched stop string `stop` (found by the detokenizer after update()): keep its
        first `keep_tokens` output tokens (the one that completed the match is the last; verified drafts after it
        are dropped), status FINISHED_STOPPED with stop_reason=stop, pages freed.

        Also for a request the latest update() already finished (max_tokens, or a stop token among tokens after
        the match): the stop string completed first, so it wins. Returns the request, or None if unknown."""
        req = self._requests.get(request_id) or self._update_finished.get(request_id)
        if req is None:
            return None
        if not 1 <= keep_tokens <= len(req.output_token_ids):
            raise ValueError(f"keep_tokens={keep_tokens} must be in [1, {len(req.output_token_ids)}] (the output "
                             f"tokens of {request_id!r})")
        if req.is_finished:  # finished by update() (pages freed, out of the queues): only its outcome changes
            req.status, req.stop_reason = RequestStatus.FINISHED_STOPPED, stop
        else:
            self._finish(req, RequestStatus.FINISHED_STOPPED, stop)
        del req.output_token_ids[keep_tokens:]
        return req

    def _finish(self, req: Request, status: RequestStatus, stop_reason: int | str | None) -> None:
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
        else:  # WAITING / PREEMPTED
            self.waiting.remove(req)
        self.kv.free(req.request_id)
        req.status = status
        req.stop_reason = stop_reason
        del self._requests[req.request_id]
        self._finished_ids.append(req.request_id)

    # ---- queries -----------------------------------------------------------------------------------
    def has_unfinished(self) -> bool:
        return bool(self._requests)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def get(self, request_id: str) -> Request | None:
        """The unfinished request with this id (finished ones are returned by update/abort/finish instead)."""
        return self._requests.get(request_id)

    def stats(self) -> SchedulerStats:
        return SchedulerStats(num_running=len(self.running), num_waiting=len(self.waiting),
                              num_free_pages=self.kv.num_free_pages, num_used_pages=self.kv.num_used_pages,
                              num_preemptions_total=self._num_preemptions_total,
                              prefix_cache_queries=self._pc_queries, prefix_cache_hits=self._pc_hits,
                              prefix_cache_hit_requests=self._pc_hit_requests,
                              num_cached_pages=self.kv.num_cached_pages)
