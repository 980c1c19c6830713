"""InputBatch: the engine's persistent, columnar state of the running sequences (host only: numpy, never jax).

Like vLLM v1's InputBatch. Each running sequence holds one row ("slot") of fixed-size tables from its first
schedule until it finishes, is aborted or is preempted (then the row is freed and reused by a later admission):

  page_table    i32[S, W]  the slot's pages in token order, 0 past num_pages (the reserved page)
  num_pages     i32[S]
  num_computed  i64[S]     tokens with KV (computed or in flight) after the slot's latest scheduled chunk
  sampling      [S] columns written once at admission: temperature top_k top_p min_p seed want_logprobs
                presence/frequency/repetition penalties
  penalised, prompt_logprobs  bool[S] flags the engine reads to find the few rows needing per-row work
  progress      bool[S]    the engine must report the slot's next token (False: offline, first token seen)
  cum_logprob   f64[S]     the sum of the slot's sampled tokens' logprobs (the engine's, while the slot is held)
  gen           i64[S]     bumped at every add and remove: a step's row whose slot generation changed since its
                           launch belongs to a request that has left (its results are stale)
  owner         [S]        an object the engine attaches to the slot (returned by remove)

Per step (make_step) nothing is rebuilt per sequence: the page table of a slot is only extended with the pages
allocated since its previous schedule (a diff of lengths), and rewritten whole only after a step that verified
drafts (update() may have released tail pages and the next allocate() taken others); the scheduler's per-sequence
fields are read with map(attrgetter) into numpy columns. The result, a StepBatch (jaxinfer/outputs.py), references
these tables: the runner packs it during dispatch, before the next make_step changes them.

The continuation (_continue). A steady decode step that is a decode run alone (engine/decode_run.py) over the same
sequences, in the same order, as the step before, which was one too and is the step in flight, with no slot added
or freed since (`version`), changes only each row's start, step and the pages of the rows that crossed a page: it
is made from the step before's arrays (shared, read-only) and names that step as its `base`, so that
runner/batch.pack_step patches the base's packed arrays instead of packing anew. At batch 256 this and the
engine's plain-step shortcuts took the engine's host step from 2.79 M to 1.89 M instructions a step
(benchmarks/probes/engine_host_steps.py, callgrind); tests/engine/test_step_continuation.py checks both against
the full paths, step by step.

Invariant (tests/engine/test_input_batch.py): for every scheduled sequence, page_table[slot, :num_pages[slot]]
equals its ScheduledSeq.page_table, and runner/batch.pack_step of the StepBatch equals runner/batch.pack of the
SeqInput list the engine used to build.
"""
from __future__ import annotations

import itertools
from operator import attrgetter, getitem
from typing import Callable, Sequence

import numpy as np

from ..outputs import StepBatch

# A ScheduledSeq's fields, read in ONE pass over the step's sequences (each pass over ~256 objects costs about as
# much as the reads themselves: the objects are touched, and cache-missed, once instead of four times).
_FIELDS = attrgetter("request_id", "page_table", "token_ids", "start_pos", "output_index", "num_spec_tokens",
                     "num_placeholders", "sample")

# Admission row: (temperature, top_k, top_p, min_p, seed, want_logprobs, presence_penalty, frequency_penalty,
# repetition_penalty, penalised, prompt_logprobs[, cum_logprob, progress]), in this order.
COLUMNS = (("temperature", np.float32, 0.0), ("top_k", np.int32, -1), ("top_p", np.float32, 1.0),
           ("min_p", np.float32, 0.0), ("seed", np.uint32, 0), ("want_logprobs", np.int32, 0),
           ("presence_penalty", np.float32, 0.0), ("frequency_penalty", np.float32, 0.0),
           ("repetition_penalty", np.float32, 1.0))


_SERIALS = itertools.count(1)  # StepBatch.serial (unique in the process: pack_step's cache is the process's)


class AdmissionError(ValueError):
    """Some sequences' admission rows do not fit the slot columns (e.g. a top_k beyond int32): `failed` holds
    (seq_id, exception) of each; they hold no slot, the others admitted are kept."""

    def __init__(self, failed: list[tuple[str, Exception]]):
        super().__init__("; ".join(f"{sid}: {type(e).__name__}: {e}" for sid, e in failed))
        self.failed = failed


class InputBatch:
    def __init__(self, max_num_seqs: int, table_width: int):
        """max_num_seqs rows of table_width pages; both grow if ever exceeded (never expected)."""
        S, W = max(1, max_num_seqs), max(1, table_width)
        self.page_table = np.zeros((S, W), np.int32)
        self.num_pages = np.zeros(S, np.int32)
        self.num_computed = np.zeros(S, np.int64)
        self.sampling = {name: np.full(S, fill, dtype) for name, dtype, fill in COLUMNS}
        self.penalised = np.zeros(S, bool)
        self.prompt_logprobs = np.zeros(S, bool)
        self.progress = np.ones(S, bool)
        self.cum_logprob = np.zeros(S, np.float64)
        self.gen = np.zeros(S, np.int64)
        self.owner: list = [None] * S
        self._dirty = np.zeros(S, bool)  # the slot's page row must be rewritten whole at its next schedule
        self._slot_of: dict[str, int] = {}
        self.step_ids: tuple = ()
        self._free = list(range(S - 1, -1, -1))  # pop() hands out 0, 1, 2, ...
        # bumped at every add, remove and growth: while it holds, every held slot's columns and its seq id are
        # unchanged (what the continuation below relies on)
        self.version = 0
        # held slots whose admission row asks for per-row work (penalised, prompt logprobs or logprobs): while none
        # is held the engine skips looking for them (_flagged marks the slots counted)
        self.num_flagged = 0
        self._flagged = np.zeros(S, bool)
        self.continuation = True  # steady decode steps from the step before (make_step); off: the tests' reference
        self._last = None  # (DecodeRun, StepBatch, slot_rows, version) of the latest make_step of a run alone
        self._aranges: dict[int, np.ndarray] = {}

    # ---- slots --------------------------------------------------------------------------------------------
    @property
    def num_slots(self) -> int:
        return len(self.num_pages)

    def slot(self, seq_id: str) -> int | None:
        return self._slot_of.get(seq_id)

    def __len__(self) -> int:
        return len(self._slot_of)

    def add(self, seq_id: str, row: Sequence, owner=None) -> int:
        """Give seq_id a free slot and write its admission row (see COLUMNS, then penalised, prompt_logprobs and
        optionally cum_logprob, progress)."""
        assert seq_id not in self._slot_of, f"{seq_id!r} already holds slot {self._slot_of[seq_id]}"
        if not self._free:
            self._grow_rows()
        s = self._slot_of[seq_id] = self._free.pop()
        try:
            for (name, _, _), v in zip(COLUMNS, row):
                self.sampling[name][s] = v
        except Exception:
            self.remove(seq_id)
            raise
        self.penalised[s], self.prompt_logprobs[s] = row[len(COLUMNS)], row[len(COLUMNS) + 1]
        extra = row[len(COLUMNS) + 2:]
        self.cum_logprob[s] = extra[0] if extra else 0.0
        self.progress[s] = extra[1] if len(extra) > 1 else True
        self.owner[s] = owner
        self.gen[s] += 1
        self.version += 1
        flagged = bool(self.penalised[s] or self.prompt_logprobs[s] or self.sampling["want_logprobs"][s])
        self._flagged[s] = flagged
        self.num_flagged += flagged
        self.num_pages[s] = 0
        self.num_computed[s] = 0
        self._dirty[s] = False
        return s

    def remove(self, seq_id: str) -> tuple | None:
        """Free seq_id's slot: its page row back to zeros. Returns (owner, cum_logprob) of the slot, or None if
        seq_id holds none."""
        s = self._slot_of.pop(seq_id, None)
        if s is None:
            return None
        self.page_table[s, :self.num_pages[s]] = 0
        self.num_pages[s] = 0
        self.gen[s] += 1
        self.version += 1
        if self._flagged[s]:
            self._flagged[s] = False
            self.num_flagged -= 1
        owner, self.owner[s] = self.owner[s], None
        self._free.append(s)
        return owner, float(self.cum_logprob[s])

    def _grow_rows(self) -> None:
        S = self.num_slots
        self.page_table = np.concatenate([self.page_table, np.zeros_like(self.page_table)])
        self.version += 1
        for name in ("num_pages", "num_computed", "penalised", "prompt_logprobs", "_dirty", "_flagged", "cum_logprob",
                     "gen"):
            a = getattr(self, name)
            setattr(self, name, np.concatenate([a, np.zeros_like(a)]))
        self.progress = np.concatenate([self.progress, np.ones(S, bool)])
        self.owner += [None] * S
        for name, dtype, fill in COLUMNS:
            self.sampling[name] = np.concatenate([self.sampling[name], np.full(S, fill, dtype)])
        self._free = list(range(2 * S - 1, S - 1, -1)) + self._free

    # ---- one step -----------------------------------------------------------------------------------------
    def make_step(self, scheduled: Sequence, admit_row: Callable[[str], Sequence],
                  prev_slot_rows: np.ndarray | None, owner_of: Callable[[str], object] | None = None,
                  decodes=None) -> tuple[StepBatch, np.ndarray]:
        """The StepBatch of `scheduled` (ScheduledSeqs, batch order), admitting sequences without a slot
        (admit_row(seq_id) gives their admission row) and applying page-table diffs. prev_slot_rows: the
        previous (in-flight) step's output row of each slot (-1: none), for placeholders. decodes: a
        decode_run.DecodeRun whose rows come first in the batch (then `scheduled`), read as columns. Returns the
        StepBatch and this step's i64[S] output row of each slot (sampling sequences; -1 elsewhere). Raises
        AdmissionError (nothing else changed but the other admissions) if some admission rows do not fit the
        columns."""
        last, self._last = self._last, None
        if decodes is not None and not scheduled:
            if (last is not None and self.continuation and last[3] == self.version and prev_slot_rows is last[2]
                    and decodes.ids == last[0].ids):
                return self._continue(decodes, last[1], last[2])
        slot_of = self._slot_of
        if scheduled:
            rids, tables, token_lists, *int_cols = zip(*map(_FIELDS, scheduled))
            k = len(scheduled)
            npg = np.fromiter(map(len, tables), np.int64, k)
            lens = np.fromiter(map(len, token_lists), np.int64, k)
            flat = np.fromiter(itertools.chain.from_iterable(token_lists), np.int64, int(lens.sum()))
            ints = np.fromiter(itertools.chain.from_iterable(int_cols), np.int64, 5 * k).reshape(5, k)
        if decodes is not None:  # steady decodes: one placeholder token each, sampled (decode_run.py)
            m = len(decodes)
            one = np.ones(m, np.int64)
            run_ints = np.stack([decodes.starts, decodes.output_index, np.zeros(m, np.int64), one, one])
            if scheduled:
                rids, tables = decodes.ids + rids, decodes.pages + list(tables)
                npg = np.concatenate([decodes.num_pages, npg])
                lens = np.concatenate([one, lens])
                flat = np.concatenate([np.full(m, -1, np.int64), flat])
                ints = np.concatenate([run_ints, ints], axis=1)
            else:
                rids, tables, npg, lens, flat, ints = (decodes.ids, decodes.pages, decodes.num_pages, one,
                                                       np.full(m, -1, np.int64), run_ints)
        n = len(rids)
        self.step_ids = rids  # the sequence ids of this step, in batch order (a tuple; read by the engine)
        rows = np.fromiter(map(slot_of.get, rids, itertools.repeat(-1, n)), np.int64, n)
        if (rows < 0).any():
            failed = []
            for i in np.flatnonzero(rows < 0).tolist():
                try:
                    rows[i] = self.add(rids[i], admit_row(rids[i]), owner_of(rids[i]) if owner_of else None)
                except (ValueError, OverflowError, TypeError) as e:
                    failed.append((rids[i], e))
            if failed:
                raise AdmissionError(failed)
        stale = (npg != self.num_pages[rows]) | self._dirty[rows]
        if stale.any():
            self._apply_page_diffs(np.flatnonzero(stale).tolist(), rows, tables, npg)
        starts, num_spec, ph = ints[0], ints[2], ints[3]
        self.num_computed[rows] = starts + lens
        if num_spec.any():  # update() may truncate these pages after the step: rewrite them at the next schedule
            self._dirty[rows[num_spec > 0]] = True
        prev_row = np.full(n, -1, np.int64)
        if ph.any():
            has = ph > 0
            if prev_slot_rows is None or (ph > 1).any() or (prev_slot_rows[rows[has]] < 0).any():
                raise AssertionError("placeholder without its sample in the step in flight")
            prev_row[has] = prev_slot_rows[rows[has]]
        sample = ints[4].astype(bool)
        slot_rows = np.full(self.num_slots, -1, np.int64)
        slot_rows[rows[sample]] = np.flatnonzero(sample)
        sb = StepBatch(flat, lens, starts, rows, prev_row, ints[1].astype(np.int32),
                       num_spec, np.full(n, -1, np.int32), self.page_table, self.num_pages, self.sampling)
        if decodes is not None and not scheduled and self.continuation:  # a run alone: the next may continue it
            sb.serial = sb.root = next(_SERIALS)
            for a in (rows, lens, flat, num_spec):
                a.flags.writeable = False  # (shared with the continuations: see _continue)
            self._last = (decodes, sb, slot_rows, self.version)
        return sb, slot_rows

    def _continue(self, run, last: StepBatch, slot_rows: np.ndarray) -> tuple[StepBatch, np.ndarray]:
        """make_step of a run alone over the same sequences, in the same order, as the latest make_step, which was
        a run alone too, with no slot added or freed since (self.version) and that step in flight (slot_rows): the
        sequences hold the same slots (rows), all sampled in that step at their batch index, so each placeholder
        comes from row i of it (prev_row = 0..n-1) and this step's slot rows are that step's; no slot is dirty (that
        make_step rewrote the dirty ones and a run has no drafts). Only the page diffs, the starts and the steps
        are new. The arrays that do not change are shared with the step before (made read-only there)."""
        rows, npg = last.rows, run.num_pages
        changed = np.flatnonzero(npg != self.num_pages[rows])
        if changed.size:
            r, m = rows[changed], npg[changed]
            old = self.num_pages[r]
            if (m == old + 1).all() and int(m.max()) <= self.page_table.shape[1]:
                # (the decode crossed into one new page each: that page, in one write; no Python loop over rows)
                idx = changed.tolist()
                self.page_table[r, old] = list(map(getitem, map(run.pages.__getitem__, idx), old.tolist()))
                self.num_pages[r] = m
            else:
                self._apply_page_diffs(changed.tolist(), rows, run.pages, npg)
        starts = run.starts
        self.num_computed[rows] = starts + 1
        n = len(rows)
        prev_row = self._aranges.get(n)
        if prev_row is None:
            prev_row = self._aranges[n] = np.arange(n, dtype=np.int64)
            prev_row.flags.writeable = False
        self.step_ids = run.ids
        sb = StepBatch(last.token_ids, last.lens, starts, rows, prev_row, run.output_index.astype(np.int32),
                       last.num_spec, np.full(n, -1, np.int32), self.page_table, self.num_pages, self.sampling,
                       serial=next(_SERIALS), base=last.serial, changed=changed, root=last.root)
        self._last = (run, sb, slot_rows, self.version)
        return sb, slot_rows

    def _apply_page_diffs(self, idx: list[int], rows: np.ndarray, tables: list, npg: np.ndarray) -> None:
        """Slots whose page count changed since their previous schedule get their new pages (appended; a
        shorter list clears the tail); dirty slots are rewritten whole."""
        need = int(npg[idx].max())
        if need > self.page_table.shape[1]:
            grown = np.zeros((self.num_slots, max(need, 2 * self.page_table.shape[1])), np.int32)
            grown[:, :self.page_table.shape[1]] = self.page_table
            self.page_table = grown
        pt, num = self.page_table, self.num_pages
        for i in idx:
            r, m = int(rows[i]), int(npg[i])
            old = int(num[r])
            if self._dirty[r]:
                pt[r, :m] = tables[i][:m]  # (a decode run's page lists are the live ones: cut at m)
                pt[r, m:max(old, m)] = 0
                self._dirty[r] = False
            elif m > old:
                pt[r, old:m] = tables[i][old:m]
            else:
                pt[r, m:old] = 0
            num[r] = m
