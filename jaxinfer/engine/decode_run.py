"""DecodeRun: a step's steady pipelined decodes as columns, not objects (host only: numpy, never jax).

At serving batch sizes almost every step is the same: every running request decodes one token whose input is
the token the step in flight is sampling. The scheduler's general loop (scheduler.py) builds a ScheduledSeq per
request per step and update() walks them again; at batch 256 that per-object Python was most of the engine's host
time per step (benchmarks/probes/host_step_cost.py, 6.7 µs per running request per step on the CPU probe).
Here the same step is a few numpy columns:

  schedule_steady   when every running request is a steady pipelined decode (exactly one token in flight, every
                    other token computed, no drafts) and the budget holds them all: one token each, pages
                    allocated only for the rows whose decode crosses a page boundary, counters advanced with
                    C-level map() calls; rows that reached their length limit are left out, as the general loop
                    leaves them out. Anything else returns None and the general loop runs.
  update_run        the finished step's tokens appended; the stop / length checks vectorised, and only the
                    rows that may stop (a stop / eos token, the length limit, a request with stop token ids)
                    go through Scheduler._check_stop in Python.

The chain. In a long steady stretch the run of step n+1 is the run of step n moved on by one token: between the
two schedule() calls the only change to its rows is the update of step n-1, which appends one token to each and
takes one from its pending count. So where (1) the latest schedule() made a run over exactly the running requests,
(2) that run's `prev` (the run before it, over the same rows) is the run whose update was the latest update() and
gave a token to every row (Scheduler._applied), and (3) no request has drafts, the next run is computed from the
last run's columns alone (_next_run: starts + 1, output_index + 1, the page crossings from the page counts) and
only the two counters of each request are written; live_rows trusts the output counts under the same conditions.
Anything else (an admission, an abort, a finish, a preemption, a general update(), an update out of order) breaks
one of the three and the next run is read from the requests again (_fresh_run). Instructions a step at batch 256
(benchmarks/probes/scheduler_steps.py, callgrind): schedule + update 3.0 M -> 1.2 M.

Measured (benchmarks/README.md, "2026-12-05 d"; host_step_cost.py offline, batch 256, host µs a step): the CPU
probe 2,379-2,700 -> 1,744-1,857 (with the numpy inputs of ModelRunner.dispatch: 2,058 -> 1,429 in one process); on
an H100's host, whose per-object Python is several times faster, ~950 -> ~800 µs of Python sections and no change
beyond the noise overall (2,024-2,094 -> 1,955-2,153: the compiled call's 1.0-1.2 ms dominates there). Below
MIN_RUN requests the general loop runs.

Invariant (tests/engine/test_decode_run.py; the engine end to end: tests/test_decode_run_e2e.py): a step
scheduled and updated through these functions leaves the scheduler, the KV manager and the requests exactly as the
general loop does, and DecodeRun.materialize() equals the ScheduledSeqs the general loop would have made.

Columns, n rows in batch order (the run is the front of the step's batch; admissions follow):
  requests  list[Request]      ids  tuple[str]
  starts    i64[n]   position of the row's token (= its tokens known before the step, = num_computed before)
  output_index i64[n] index in the request's outputs of the token the row samples
  pages     list[list[int]]    the KV manager's live page lists (only appended to until the row's step is done)
  num_pages i64[n]   their lengths right after this schedule
  limit     i64[n]   the output count that ends the row by length (Request.output_limit)
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import compress, repeat
from operator import and_, attrgetter, is_

import numpy as np

from .request import STOP_CHECK_ALWAYS, STOP_CHECK_EOS, Request, RequestStatus

# `sched` below is the calling scheduler.Scheduler (which imports this module: no import back)

_PENDING = attrgetter("num_pending_tokens")
_COMPUTED = attrgetter("num_computed_tokens")
_OUTPUTS = attrgetter("output_token_ids")
_PROMPT = attrgetter("prompt_token_ids")
_SPEC = attrgetter("spec_token_ids")
_LIMIT = attrgetter("output_limit")
_RID = attrgetter("request_id")
_STATUS = attrgetter("status")
_STOP_CHECK = attrgetter("stop_check")
_RUNNING = RequestStatus.RUNNING


def _consume(it) -> None:
    deque(it, maxlen=0)


@dataclass(slots=True)
class DecodeRun:
    requests: list
    ids: tuple
    starts: np.ndarray
    output_index: np.ndarray
    pages: list
    num_pages: np.ndarray
    limit: np.ndarray  # i64[n] Request.output_limit (the output count that ends the row by length)
    check: np.ndarray | None = None  # i64[n] Request.stop_check
    # The chain (module docstring): the run of the schedule() before, over the same rows, or None
    prev: DecodeRun | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def materialize(self, seq_type) -> list:
        """The rows as the ScheduledSeqs (seq_type: scheduler.ScheduledSeq) the general loop makes (page tables:
        each row's pages at schedule time; valid until the row's step is updated, after which speculative
        rollback may truncate a page list)."""
        return [seq_type(rid, [-1], s, pages[:m], True, False, 1, oi, 0, req)
                for rid, s, pages, m, oi, req in zip(self.ids, self.starts.tolist(), self.pages,
                                                     self.num_pages.tolist(), self.output_index.tolist(),
                                                     self.requests)]


# Below this many running requests the general loop is as cheap as the columns, whose numpy calls cost a fixed
# ~50 µs a step (the scheduler alone on this CPU, schedule / update µs a step, loop -> columns: 64 requests 51 / 42
# -> 48 / 46, 128: 102 / 83 -> 79 / 74, 256: 209 / 276 -> 142 / 129 with prefix caching; batch 1: ~10 -> ~100).
MIN_RUN = 64


def schedule_steady(sched, budget: int) -> DecodeRun | None:
    """Step 1 of schedule() for a batch of steady decodes, or None (nothing changed) when it is not one."""
    running = sched.running
    n = len(running)
    if n < sched.min_decode_run or n > budget:
        return None
    if any(map(_SPEC, running)):
        return None  # drafts
    last = sched._last_run
    if last is not None and last.prev is not None and sched._applied is last.prev and running == last.requests:
        run = _next_run(sched, last)
        if run is not None:
            return run
    return _fresh_run(sched, running, n, last)


def _next_run(sched, last: DecodeRun) -> DecodeRun | None:
    """The chain's step (module docstring): the run after `last` over the same rows, from its columns alone (no
    request is read), or None where the rows are not all taken (a length limit) or the pages run out (then
    _fresh_run decides, as without the chain)."""
    nout = last.output_index  # the outputs known now: the run before's update added one to each row
    limit = last.limit
    if not (nout + 1 < limit).all():
        return None  # a row's token in flight is its last one: _fresh_run leaves it out
    starts = last.starts + 1
    npg = last.num_pages
    kv = sched.kv
    need = starts >= npg * kv.page_size  # the decode's position starts a new page
    grow = np.flatnonzero(need).tolist()
    if grow:
        if len(grow) > kv.num_free_pages:
            return None
        ids = last.ids
        kv.append_page_each([ids[i] for i in grow])
        npg = npg + need
    reqs = last.requests
    # (a plain loop: the slot attributes' specialised bytecodes cost a third of map(setattr, ...) here)
    for req in reqs:
        req.num_computed_tokens += 1
        req.num_pending_tokens = 2
    # The chain reads one link back (schedule_steady and live_rows compare a run's `prev` with sched._applied, by
    # identity); last.prev is updated already (sched._applied), so its own link is cut: else every run of a long
    # steady stretch stayed alive, columns and all, through the links (a chain as long as the stretch).
    last.prev.prev = None
    return DecodeRun(reqs, last.ids, starts, nout + 1, last.pages, npg, limit, last.check, last)


def _fresh_run(sched, running: list, n: int, last: DecodeRun | None) -> DecodeRun | None:
    """schedule_steady with every row read from its request."""
    if list(map(_PENDING, running)).count(1) != n:
        return None  # a token not in flight (a prefill, the first decode, async off)
    starts = np.fromiter(map(_COMPUTED, running), np.int64, n)
    nout = np.fromiter(map(len, map(_OUTPUTS, running)), np.int64, n)
    known = nout + np.fromiter(map(len, map(_PROMPT, running)), np.int64, n)
    if not np.array_equal(starts, known):
        return None  # some request has more than the token in flight to compute (e.g. a recompute)
    ids = list(map(_RID, running))
    pages = list(map(sched.kv.page_lists.get, ids))
    if None in pages:
        return None
    npg = np.fromiter(map(len, pages), np.int64, n)
    # _reached_length: the token in flight is the row's last one (max_tokens or max_model_len): nothing to run
    limit = np.fromiter(map(_LIMIT, running), np.int64, n)
    take = nout + 1 < limit
    if not take.any():
        return None
    need = take & (starts + 1 > npg * sched.kv.page_size)  # the decode's position starts a new page
    grow = np.flatnonzero(need).tolist()
    if len(grow) > sched.kv.num_free_pages:
        return None  # the general loop preempts
    if grow:  # one page each, in running order (the order the general loop allocates in)
        sched.kv.append_page_each([ids[i] for i in grow])
    npg[need] += 1
    reqs = running
    if not take.all():
        keep = take.tolist()
        reqs, ids, pages = list(compress(running, keep)), list(compress(ids, keep)), list(compress(pages, keep))
        starts, nout, npg, limit = starts[take], nout[take], npg[take], limit[take]
    _consume(map(setattr, reqs, repeat("num_computed_tokens"), (starts + 1).tolist()))
    _consume(map(setattr, reqs, repeat("num_pending_tokens"), repeat(2, len(reqs))))
    reqs = list(reqs)
    check = np.fromiter(map(_STOP_CHECK, reqs), np.int64, len(reqs))
    # the chain starts here when the run before had the same rows (its update then leaves them as the next
    # _next_run expects: checked there through sched._applied)
    prev = last if last is not None and last.requests == reqs else None
    return DecodeRun(reqs, tuple(ids), starts, nout + 1, pages, npg, limit, check, prev)


def live_rows(sched, run: DecodeRun) -> np.ndarray:
    """update()'s validation of the run's rows: bool[n], True where the request is still the one scheduled and
    running. Raises (changing nothing) if a live row's output count is not the one it sampled for."""
    reqs, n = run.requests, len(run)
    # The running list holds exactly the RUNNING requests, so a run that is still its front is all live (the
    # common case; list == compares by identity, Request having no __eq__). Otherwise row by row.
    if sched.running[:n] == reqs:
        live = np.ones(n, bool)
        if run.prev is not None and sched._applied is run.prev:
            return live  # the chain: the latest update, the run before's, gave each row the output checked here
    else:
        live = np.fromiter(map(and_, map(is_, map(sched._requests.get, run.ids), reqs),
                               map(is_, map(_STATUS, reqs), repeat(_RUNNING, n))), bool, n)
    nout = np.fromiter(map(len, map(_OUTPUTS, reqs)), np.int64, n)
    bad = np.flatnonzero((nout != run.output_index) & live)
    if bad.size:
        i = int(bad[0])
        raise RuntimeError(f"request {run.ids[i]!r}: update() got the sample for output {int(run.output_index[i])} "
                           f"but the request has {int(nout[i])} outputs; call update() exactly once per "
                           f"schedule(), in order")
    return live


def cache_run_pages(sched, run: DecodeRun, live: np.ndarray) -> None:
    """update()'s prefix-cache registration for the run's rows: only a row whose token filled its page."""
    ps = sched.kv.page_size
    ends = run.starts + 1
    # (a power-of-two page size: a bit mask, not numpy's integer remainder)
    filled = ((ends & (ps - 1) if ps & (ps - 1) == 0 else ends % ps) == 0) & live
    rows = np.flatnonzero(filled).tolist()
    if not rows:
        return
    items, reqs = [], run.requests
    for i, e in zip(rows, ends[rows].tolist()):  # (the ends of these rows only: ~1 in page_size)
        req = reqs[i]
        end = min(e, len(req.prompt_token_ids) + len(req.output_token_ids), req.num_computed_tokens)
        items.append((req.request_id, req.page_hashes, req.token_slice, end // ps))
    sched.kv.cache_pages_each(items)


def update_run(sched, run: DecodeRun, live: np.ndarray, tokens: list[int],
               finished: list[Request]) -> None:
    """Append the run's sampled tokens (tokens[i]: row i's; ignored where not live) and end the rows that stop,
    in batch order (appended to `finished`)."""
    if live.all():
        reqs, toks = run.requests, tokens
    else:
        keep = live.tolist()
        reqs, toks = list(compress(run.requests, keep)), list(compress(tokens, keep))
        if not reqs:
            return
    toks = list(map(int, toks))  # (numpy ints from a caller would leak into the outputs)
    m = len(reqs)
    for req, t in zip(reqs, toks):  # (a plain loop: cheaper than map(setattr, ...) / map(list.append, ...))
        req.output_token_ids.append(t)
        req.num_pending_tokens -= 1
    if m == len(run):
        sched._applied = run  # every row got its token: what the chain's next steps rely on
    # candidates: the length limit reached (outputs = output_index + 1 now), a request with stop token ids, an eos
    check = run.check
    may_stop = (run.output_index + 1 >= run.limit) | (check == STOP_CHECK_ALWAYS)
    eos_ids = sched.eos_token_ids
    if eos_ids and not eos_ids.isdisjoint(toks):  # (most steps sample no eos id: no column to build)
        tok = np.zeros(len(run), np.int64)
        tok[live] = toks
        eos = np.zeros(len(run), bool)
        for e in eos_ids:  # (a handful of ids: np.isin's sort costs more)
            eos |= tok == e
        may_stop |= eos & (check == STOP_CHECK_EOS)
    if m != len(run):
        may_stop = may_stop[live]
    for i in np.flatnonzero(may_stop).tolist():
        req, t = reqs[i], toks[i]
        # the general loop's test, exactly (a row with stop token ids is only a candidate)
        if len(req.output_token_ids) < req.output_limit and t not in req.stop_token_ids and (
                req.ignore_eos or t not in eos_ids):
            continue
        sched._end_if_stopped(req, t, finished)
