"""LLMEngine: the only loop. Host code only (never imports jax): the device runner is injected.

step():
  1 Scheduler.schedule()             -> which tokens of which requests run now (chunked prefill + decodes)
  2 runner.dispatch(StepBatch)       -> launch the step on the device; returns at once. The StepBatch comes from
                                        engine/input_batch.py's persistent slot tables, updated by diffs
  3 finish the PREVIOUS step: runner.fetch (waits for it), Scheduler.update (append tokens; eos / stop
    tokens / max_tokens; free pages), incremental detokenization (its text deltas are kept for the outputs; a
    stop string ends the request with one Scheduler.finish_by_stop_string call and never leaks into the text)
  4 RequestOutputs, as each request's SamplingParams.output_kind asks (like vLLM's RequestOutputKind):
    CUMULATIVE for every request that progressed, the output so far; DELTA only the new part (the text delta
    and the new token ids of this step); FINAL_ONLY once, when the request has finished

Pipelining: step n+1 is scheduled, packed and dispatched while step n runs on the device. Decode tokens that
step n is still sampling are placeholders that the device fills from step n's output. A request that stops
at step n (eos, stop string) may have computed one extra token in step n+1; it is discarded. With
`async_scheduling=False` each step is finished before the next is scheduled.

Speculative decoding (optional `spec`, engine/spec_control.py): before scheduling, decode-ready requests get
draft tokens; the scheduler makes each a k+1-token chunk in the same batch; the step returns 1..k+1 verified
tokens per such request. With a device draft source (the proposer's `propose_device`) and `spec.pipelined`,
speculative steps pipeline too: step n+1 is scheduled for the worst case of step n and corrected on the device
(engine/spec_pipeline.py, runner/spec_carry.py); otherwise steps that speculate are not pipelined.
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import operator
import random
import time
from typing import Any, Sequence

import numpy as np

from . import spec_pipeline
from .detokenizer import IncrementalDetokenizer
from .input_batch import AdmissionError, InputBatch
from .isolation import failing_rows
from .kv_cache import KVCacheManager
from .output_builder import (add_logprob, build_outputs, logprob_dict, prompt_logprob_targets,
                             record_prompt_logprobs)
from .penalty_slots import PenaltySlots
from .request import Request
from .scheduler import Scheduler, ScheduledSeq
from .seq_state import Group, SeqState
from ..config import SchedulerConfig
from ..outputs import RequestOutput, Runner, StepBatch
from ..sampling_params import RequestOutputKind, SamplingParams

_RID = operator.attrgetter("request_id")
_FINAL_ONLY = RequestOutputKind.FINAL_ONLY


log = logging.getLogger("jaxinfer")


@dataclasses.dataclass
class _Step:
    """A dispatched step: what was scheduled and the runner's handle to its results."""

    sched: Any
    flight: Any
    slot_rows: Any  # i64[InputBatch slots]: output row of each slot's sampling sequence (-1: none)
    speculative: bool = False  # some sequence verifies drafts: finish before scheduling the next step
    pipe: Any = None  # spec_pipeline.PipePlan made while this step was in flight (bumps to undo at its finish)
    # plain step (no speculation, logprobs or prompt logprobs): finished by _finish_plain, with the
    # rows' slots and their generations at launch (a changed generation: the request left since)
    plain: bool = False
    rows: Any = None
    gen: Any = None
    sample: Any = None
    ids: tuple = ()  # the sequence ids of its rows
    version: int = -1  # InputBatch.version at launch (unchanged at the finish: every row still holds its slot)


def _detok_append(st: SeqState, tok: int, stop_terminated: bool) -> str | None:
    """One kept output token through the sequence's detokenizer (its text delta kept for the next report, unless
    the group reports only at the end); returns the stop string it completed, or None. stop_terminated: the token
    is an eos / stop token id that ended the sequence, so its text is not part of the output (vLLM semantics)."""
    delta, stop = st.detok.append((tok,), stop_terminated=stop_terminated)
    if delta and st.keep_deltas:
        st.text_delta += delta
    return stop


class LLMEngine:
    # the plain step's host shortcuts (_launch: no flagged slot held, no per-row lookups; _finish_plain: no slot
    # added or freed since the launch, no generation compared); off: the full paths (the tests' reference)
    shortcuts = True

    def __init__(self, runner: Runner, tokenizer, scheduler: SchedulerConfig, *, max_model_len: int,
                 eos_token_ids: set[int], vocab_size: int, seed: int = 0, spec=None):
        """scheduler: the step budget, pipelining and prefix caching options (its max_model_len is resolved by
        the caller against the model: `max_model_len`)."""
        self.runner = runner
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        # Prefix caching: page hashes are bound to the KV dtype (extra_key), so a cache can never serve KV of
        # another dtype (matters once several configurations/adapters share a manager).
        self.kv = KVCacheManager(runner.num_pages, runner.page_size,
                                 enable_prefix_caching=scheduler.enable_prefix_caching,
                                 extra_key=("kv_dtype", str(getattr(runner, "kv_dtype", None))))
        self.scheduler = Scheduler(self.kv, scheduler.max_num_batched_tokens, scheduler.max_num_seqs, max_model_len,
                                   set(eos_token_ids))
        self._seqs: dict[str, SeqState] = {}
        self._groups: dict[str, Group] = {}
        self._rng = random.Random(seed)
        self._ids = itertools.count()
        self.async_scheduling = scheduler.async_scheduling
        self._in_flight: _Step | None = None
        self._penalty_slots = PenaltySlots(int(getattr(runner, "num_penalty_slots", 0)))
        self.input_batch = InputBatch(scheduler.max_num_seqs, -(-max_model_len // runner.page_size))
        self.spec = spec  # SpecControl or None
        self._failed_outputs: list[RequestOutput] = []  # requests ended with an error by _launch (isolation)

    # ---- requests -----------------------------------------------------------------------------------------
    def add_request(self, request_id: str | None, prompt: str | Sequence[int],
                    params: SamplingParams | None = None, *, stream: bool = True) -> str:
        """Queue a request. Raises ValueError (and queues nothing) if it is invalid or can never fit.

        What step() reports for it is params.output_kind (RequestOutputKind). stream=False is FINAL_ONLY whatever
        the params say (offline batches: building a cumulative RequestOutput for every running request at every
        step was the largest host cost at batch 256).
        """
        params = params or SamplingParams()
        request_id = str(next(self._ids)) if request_id is None else str(request_id)
        if request_id in self._groups:
            raise ValueError(f"request id {request_id!r} is already in use; pick a unique request_id")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this model has no tokenizer (dummy weights, or no tokenizer files in the checkpoint); "
                                 "pass prompts as lists of token ids, or load it with tokenizer=PATH")
            prompt_text, ids = prompt, self.tokenizer.encode(prompt)
        else:
            prompt_text, ids = None, [int(t) for t in prompt]
        if not ids:
            raise ValueError("the prompt is empty; pass at least one token")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})")
        if params.uses_penalties and self._penalty_slots.num_slots < max(1, params.n):
            raise ValueError(f"presence/frequency/repetition penalties need a runner with a penalty table; this "
                             f"runner ({type(self.runner).__name__}) has {self._penalty_slots.num_slots} slots")
        seq_ids = [request_id if params.n == 1 else f"{request_id}#{i}" for i in range(params.n)]
        base_seed = params.seed if params.seed is not None else self._rng.getrandbits(31)
        new_states = []
        for i, sid in enumerate(seq_ids):
            req = Request(sid, list(ids), params)
            # prompt_logprobs need the logits of every prompt position: never start from cached pages.
            req.use_prefix_cache = params.prompt_logprobs is None
            detok = None
            if self.tokenizer is not None:
                detok = IncrementalDetokenizer(self.tokenizer, list(ids), params.skip_special_tokens,
                                               list(params.stop or []), params.include_stop_str_in_output,
                                               min_tokens=params.min_tokens)
            new_states.append(SeqState(req, params, base_seed + i, detok,
                                        [] if params.logprobs is not None else None,
                                        prompt_logprobs=[None] if params.prompt_logprobs is not None else None,
                                        group_id=request_id))
        # Validate all before queueing any (add_request raises on oversize requests).
        for k, st in enumerate(new_states):
            try:
                self.scheduler.add_request(st.request)
            except Exception:
                for prev in new_states[:k]:
                    self.scheduler.abort(prev.request.request_id)
                raise
        kind = params.output_kind if stream else _FINAL_ONLY
        for st in new_states:
            st.keep_deltas = kind is not _FINAL_ONLY
            self._seqs[st.request.request_id] = st
        self._groups[request_id] = Group(request_id, prompt_text, list(ids), seq_ids, time.monotonic(),
                                          kind=kind)
        return request_id

    def abort(self, request_id: str) -> bool:
        group = self._groups.pop(request_id, None)
        if group is None:
            return False
        for sid in group.seq_ids:
            self.scheduler.abort(sid)
            self._seqs.pop(sid, None)
            if self.spec is not None:
                self.spec.free(sid, forget=True)
        return True

    def has_unfinished(self) -> bool:
        return bool(self._groups) or self._in_flight is not None

    def prefix_cache_stats(self) -> dict:
        """Prefix-cache counters since start: enabled, queries / hits (prompt+output tokens looked up / found
        cached at admission), hit_rate, hit_requests, cached_pages (pages holding a hash now), evictions."""
        st = self.scheduler.stats()
        return {"enabled": self.kv.enable_prefix_caching, "queries": st.prefix_cache_queries,
                "hits": st.prefix_cache_hits, "hit_rate": st.prefix_cache_hit_rate,
                "hit_requests": st.prefix_cache_hit_requests, "cached_pages": st.num_cached_pages,
                "evictions": self.kv.num_evictions}

    # ---- the loop -----------------------------------------------------------------------------------------
    def spec_stats(self) -> dict | None:
        """Speculative decoding counters since start (None when off): verify steps, draft / accepted / emitted
        tokens, acceptance_rate, mean_accepted_length (tokens per verification, accepted + 1)."""
        return None if self.spec is None else self.spec.stats.as_dict()

    def step(self) -> list[RequestOutput]:
        outputs = []
        plan = None  # pipelined speculation (spec_pipeline.py): drafts made on the device from the step in flight
        if self.spec is not None and self.spec.active(self.scheduler.num_running):
            params_of = lambda rid: self._seqs[rid].params  # noqa: E731
            if self._in_flight is not None and spec_pipeline.can_pipeline(self.spec, self.async_scheduling):
                plan = self._in_flight.pipe = spec_pipeline.prepare(self.spec, self.scheduler.running,
                                                                     self._in_flight, params_of, self._row_in_flight)
            else:
                if self._in_flight is not None:  # drafts need every token known: finish the step in flight first
                    outputs = self._finish_step(self._in_flight)
                    self._in_flight = None
                if hasattr(self.spec.proposer, "propose"):
                    self.spec.propose(self.scheduler.running, params_of)
        sched = self.scheduler.schedule()
        if self.spec is not None:
            for rid in sched.preempted_ids + sched.finished_ids:
                self.spec.free(rid)
        if plan is not None:
            self._in_flight.flight = spec_pipeline.device_drafts(self.spec.proposer, plan, sched,
                                                                 self._in_flight.flight, self.scheduler.get)
        launched = self._launch(sched)
        if self._failed_outputs:
            outputs += self._failed_outputs
            self._failed_outputs = []
        if self._in_flight is not None:
            outputs += self._finish_step(self._in_flight, launched)
        self._in_flight = launched
        if launched is not None and (not self.async_scheduling or (
                launched.speculative and not spec_pipeline.can_pipeline(self.spec, True))):
            self._in_flight = None
            outputs += self._finish_step(launched)
        return outputs

    def _row_in_flight(self, request_id: str) -> int | None:
        """The output row of `request_id` in the step in flight (None: it does not sample there). Valid until the
        next _launch frees or reuses slots."""
        s = self.input_batch.slot(request_id)
        rows = self._in_flight.slot_rows
        row = -1 if s is None or s >= len(rows) else int(rows[s])
        return None if row < 0 else row

    def _launch(self, sched) -> _Step | None:
        ib = self.input_batch
        for sid in sched.finished_ids + sched.preempted_ids:  # (before admissions: a freed id may come back)
            self._penalty_slots.release(sid)
            gone = ib.remove(sid)
            if gone is not None and gone[0] is not None:
                gone[0].cumulative_logprob = gone[1]
        if sched.is_empty:
            return None
        seqs = self._seqs
        in_flight = self._in_flight
        prev_slot_rows = in_flight.slot_rows if in_flight is not None else None
        def admit_row(sid):
            st = seqs[sid]
            return st.sampling_row + (st.cumulative_logprob, st.report_progress)

        try:
            batch, slot_rows = ib.make_step(sched.seqs, admit_row, prev_slot_rows, seqs.__getitem__, sched.decodes)
        except AdmissionError as e:  # a request whose sampling settings do not fit the columns: it fails alone
            for gid in sorted({seqs[sid].group_id for sid, _ in e.failed}):
                err = next(x for sid, x in e.failed if seqs[sid].group_id == gid)
                log.error("request %s failed at admission (%s: %s); the rest continue", gid, type(err).__name__, err)
                self._fail_group(gid, f"the engine step failed on this request: {type(err).__name__}: {err}")
            sched = sched.replaced([s for s in sched.scheduled if s.request_id in seqs])
            if sched.is_empty:
                return None
            batch, slot_rows = ib.make_step(sched.seqs, admit_row, prev_slot_rows, seqs.__getitem__)
        rows = batch.rows
        lp_targets = {}
        flagged = ib.num_flagged if self.shortcuts else 1  # (0: no held slot asks for per-row work)
        if flagged:
            pen = np.flatnonzero(ib.penalised[rows])  # the few rows needing per-row work
            for i in pen.tolist():
                s = sched.scheduled[i]
                self._penalty_feed(batch, i, seqs[s.request_id], s)
            for i in np.flatnonzero(ib.prompt_logprobs[rows]).tolist():
                tgt = prompt_logprob_targets(seqs[sched.scheduled[i].request_id], sched.scheduled[i])
                if tgt is not None:
                    lp_targets[i] = tgt
        prev = in_flight.flight if in_flight is not None else None
        ids = ib.step_ids
        try:
            flight = self.runner.dispatch(batch, prev, lp_targets or None)
        except Exception as e:  # noqa: BLE001 - one request's row can fail the batch: end it alone (isolation.py)
            sched, batch, lp_targets, slot_rows = self._drop_failing_rows(sched, batch, lp_targets, prev, e)
            if not sched.scheduled:
                return None
            ids = tuple(map(_RID, sched.scheduled))
            flight = self.runner.dispatch(batch, prev, lp_targets or None)  # still failing: the caller's problem
        speculative = bool(batch.num_spec.any())
        rows = batch.rows
        plain = (not speculative and self.spec is None and not lp_targets
                 and not (flagged and (ib.prompt_logprobs[rows].any() or ib.sampling["want_logprobs"][rows].any())))
        if not plain:
            return _Step(sched, flight, slot_rows, speculative)
        return _Step(sched, flight, slot_rows, plain=True, rows=rows, gen=ib.gen[rows], sample=slot_rows[rows] >= 0,
                     ids=ids, version=ib.version)

    def _drop_failing_rows(self, sched, batch: StepBatch, lp_targets: dict, prev, err: Exception):
        """The step's dispatch raised `err`: find the rows that fail alone (probe dispatches, isolation.py), end
        their requests (every sequence of the group) with an error output, and return the step without them:
        (sched, batch, prompt-logprob targets, slot rows), re-indexed. Re-raises `err` if no row fails alone."""
        def ok(idx) -> bool:
            tg = {k: lp_targets[i] for k, i in enumerate(idx) if i in lp_targets}
            try:  # a probe must not count its discarded sample into the penalty table
                self.runner.fetch(self.runner.dispatch(batch.select(idx, drop_penalty_slots=True), prev, tg or None))
                return True
            except Exception:  # noqa: BLE001
                return False

        bad = failing_rows(batch.num_seqs, ok)
        if not bad:
            raise err
        msg = f"the engine step failed on this request: {type(err).__name__}: {err}"
        groups = {self._seqs[sched.scheduled[i].request_id].group_id for i in bad}
        log.error("engine step failed (%s: %s); ending request(s) %s alone, the rest continue", type(err).__name__,
                  err, sorted(groups))
        for gid in sorted(groups):
            self._fail_group(gid, msg)
        keep = [i for i, s in enumerate(sched.scheduled) if s.request_id in self._seqs]
        new_sched = sched.replaced([sched.scheduled[i] for i in keep])
        sub = batch.select(keep)
        slot_rows = np.full(self.input_batch.num_slots, -1, np.int64)
        for k, s in enumerate(new_sched.scheduled):
            if s.sample:
                slot_rows[sub.rows[k]] = k
        targets = {k: lp_targets[i] for k, i in enumerate(keep) if i in lp_targets}
        return new_sched, sub, targets, slot_rows

    def _fail_group(self, gid: str, message: str) -> None:
        """End every sequence of request `gid` now (finish_reason 'abort') and queue its final output, carrying
        `message` as its error, for this step()."""
        g = self._groups.get(gid)
        if g is None:
            return
        for sid in g.seq_ids:
            self.scheduler.abort(sid)
        outs = self._outputs(set(g.seq_ids), set(g.seq_ids))
        for o in outs:
            o.error = message
        self._failed_outputs += outs

    def _penalty_feed(self, batch: StepBatch, i: int, st: SeqState, s: ScheduledSeq) -> None:
        """Penalty slot of penalised sequence i of the step (its penalty values are slot columns); on its first
        schedule since admission, take a slot of the device count table and have the runner fill it from the
        known tokens (engine/penalty_slots.py)."""
        req = st.request
        slot = self._penalty_slots.get(req.request_id)
        if slot is None:
            # Just admitted (new or after preemption): nothing of it was in flight before this step, so the
            # known outputs are all of them (this step's sample is the only pending one).
            assert req.num_pending_tokens == int(s.sample), (req, s)
            slot = self._penalty_slots.acquire(req.request_id)
            batch.penalty_inits[i] = (slot, list(req.prompt_token_ids), list(req.output_token_ids))
        batch.penalty_slot[i] = slot if s.sample else -1

    def _finish_plain(self, done: _Step, out) -> list[RequestOutput]:
        """_finish_step of a plain step (one sampled token per sampling row, no logprobs or drafts): the rows'
        results as columns, the logprob sums in the InputBatch; Python per row only in Scheduler.update, the
        detokenizer (when there is a tokenizer) and for the requests that report (_outputs)."""
        ib = self.input_batch
        # the sampling rows whose request still holds the slot it ran in (no slot added or freed since the launch:
        # all of them, no generation to compare)
        if self.shortcuts and ib.version == done.version:
            valid = done.sample
        else:
            valid = done.sample & (ib.gen[done.rows] == done.gen)
        every = self.shortcuts and bool(valid.all())
        rids = tokens = None  # (the valid rows' ids and tokens as lists: only where needed)
        run = done.sched.decodes
        if run is None:
            rids = list(itertools.compress(done.ids, valid.tolist()))
            tokens = out.tokens[valid].tolist()
            sampled = dict(zip(rids, map(list, zip(tokens))))
            finished = {r.request_id for r in self.scheduler.update(done.sched, sampled)}
        else:  # the run's rows as a column (the scheduler checks which are still live); the rest as a dict
            m = len(run)
            rest = list(itertools.compress(range(m, len(done.ids)), valid[m:].tolist()))
            sampled = {done.ids[i]: [int(out.tokens[i])] for i in rest}
            finished = {r.request_id for r in self.scheduler.update(done.sched, sampled, out.tokens[:m].tolist())}
        if every:
            rows = done.rows
            ib.cum_logprob[rows] += out.logprobs  # (rows of a step are distinct slots)
        else:
            rows = done.rows[valid]
            ib.cum_logprob[rows] += out.logprobs[valid]
        if self.tokenizer is not None:
            if rids is None:
                rids, tokens = list(itertools.compress(done.ids, valid.tolist())), out.tokens[valid].tolist()
            self._detokenize_plain(rids, tokens, finished)
        # only the requests that report progress (not FINAL_ONLY ones, which report once, finished) and the
        # finished ones go through _outputs
        progress = ib.progress[rows]
        if not progress.any():
            touched = set()
        else:
            if rids is None:
                rids = list(itertools.compress(done.ids, valid.tolist()))
            touched = set(itertools.compress(rids, progress.tolist()))
        return self._outputs(touched | finished, finished)

    def _detokenize_plain(self, rids: list[str], tokens: list[int], finished: set[str]) -> None:
        """A plain step's one new token per sequence (`rids`, still in their slots) through its detokenizer, as
        _finish_step's per-token loop does for one kept token: stop strings end the request (added to `finished`,
        in place), finished sequences flush their held-back text."""
        seqs, scheduler = self._seqs, self.scheduler
        for sid, tok in zip(rids, tokens):
            st = seqs[sid]
            if st.detok is None:
                continue
            req = st.request
            stop = _detok_append(st, tok, sid in finished and req.finish_reason == "stop")
            if stop is not None:
                # the token completing the match is the request's last output (update() appended it; it may also
                # have finished the request, then only the outcome changes)
                scheduler.finish_by_stop_string(sid, stop, len(req.output_token_ids))
                finished.add(sid)
        self._flush_detokenizers(finished)

    def _flush_detokenizers(self, finished: set[str]) -> None:
        """Finished sequences release their detokenizer's held-back text into their next report."""
        for sid in finished:
            st = self._seqs[sid]
            if st.detok is not None:
                delta = st.detok.flush()
                if st.keep_deltas:
                    st.text_delta += delta

    def _finish_step(self, done: _Step, next_step: _Step | None = None) -> list[RequestOutput]:
        """Apply a fetched step. next_step: the step dispatched after it (still in flight), whose chunks
        pipelined speculation moves by this step's rejected drafts (spec_pipeline.reconcile)."""
        out = self.runner.fetch(done.flight)
        if done.plain and out.num_accepted is None and not out.prompt_logprobs:
            return self._finish_plain(done, out)
        sched = done.sched
        sampled: dict[str, list[int]] = {}
        sampled_lps: dict[str, list[float]] = {}
        # one conversion to Python ints / floats for the whole step (indexing numpy per row costs ~0.3 µs a row)
        tokens, logprobs = out.tokens.tolist(), out.logprobs.tolist()
        if out.num_accepted is not None:  # a verification step: its rows as lists too
            num_acc, spec_toks, spec_lps = (out.num_accepted.tolist(), out.spec_tokens.tolist(),
                                            out.spec_logprobs.tolist())
        for i, s in enumerate(sched.scheduled):
            st = self._seqs.get(s.request_id)
            if st is None or st.request.is_finished or (s.request is not None and st.request is not s.request):
                continue  # aborted or stopped while this step ran (its id maybe reused since): results dropped
            if i in out.prompt_logprobs:
                record_prompt_logprobs(self.tokenizer, st, s, out.prompt_logprobs[i])
            if s.sample and s.num_spec_tokens:  # verified drafts: accepted ones + the target's next token
                m = num_acc[i]
                sampled[s.request_id] = spec_toks[i][:m + 1]
                sampled_lps[s.request_id] = spec_lps[i][:m + 1]
            elif s.sample:
                sampled[s.request_id] = [tokens[i]]
                sampled_lps[s.request_id] = [logprobs[i]]
        spec_pipeline.unbump(done.pipe, self.scheduler)
        finished = {r.request_id for r in self.scheduler.update(sched, sampled)}
        spec_pipeline.reconcile(done.pipe, sched, sampled, next_step.sched if next_step is not None else None)
        touched = set()
        for i, s in enumerate(sched.scheduled):
            sid = s.request_id
            if sid not in sampled:
                continue
            st = self._seqs[sid]
            if st.detok is None and st.logprobs is None and not s.num_spec_tokens:  # hot path: one plain token
                if len(st.request.output_token_ids) > s.output_index:  # kept (not preempted in between)
                    add_logprob(self.input_batch, st, sampled_lps[sid][0])
                    if st.report_progress:
                        touched.add(sid)
                continue
            # tokens the scheduler kept (none if preempted in between; none after a stop)
            new = st.request.output_token_ids[s.output_index:s.output_index + len(sampled[sid])]
            if s.num_spec_tokens and self.spec is not None and new:
                self.spec.record(sid, s.num_spec_tokens, len(sampled[sid]) - 1, st.request.num_computed_tokens)
            for j, tok in enumerate(new):
                lp = sampled_lps[sid][j]
                add_logprob(self.input_batch, st, lp)
                if st.logprobs is not None:  # (requests asking for logprobs never speculate: j == 0)
                    st.logprobs.append(logprob_dict(self.tokenizer, tok, lp, out.top_ids[i], out.top_logprobs[i],
                                                          st.params.logprobs))
                if st.detok is None:
                    continue
                last = j == len(new) - 1
                # eos / a stop token id ended it: its text is not part of the output (vLLM semantics)
                stop = _detok_append(st, tok, last and sid in finished and st.request.finish_reason == "stop")
                if stop is not None:
                    # ends it (or re-labels it, if this update finished it too: the stop string came first) and
                    # drops the verified tokens after the match
                    self.scheduler.finish_by_stop_string(sid, stop, s.output_index + j + 1)
                    finished.add(sid)
                    break
            if new:
                touched.add(sid)
        self._flush_detokenizers(finished)
        return self._outputs(touched | finished, finished)

    def _outputs(self, seq_ids: set[str], finished: set[str]) -> list[RequestOutput]:
        """RequestOutputs of the groups of seq_ids (output_builder.build_outputs; finished groups are dropped)."""
        return build_outputs(self._seqs, self._groups, self.input_batch, self.spec, seq_ids, finished)
