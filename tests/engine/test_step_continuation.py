"""The steady decode step's continuation (InputBatch.make_step continuing the step before, runner/batch.pack_step
patching that step's packed arrays) and the plain finish's shortcuts (LLMEngine._launch / _finish_plain: no
flagged slot, no slot added or freed since the launch) against the full paths, step by step.

1. Scheduler level: the same pipelined schedule through two InputBatches, one with the continuation (the
   default) and one without (`continuation = False`, every step made in full): equal StepBatch fields, slot tables
   and slot rows, and pack_step of both equal array by array (the full packing of the reference is itself checked
   against pack_reference in test_input_batch.py), the continuation's mostly into the buffers of a packing
   released after its step's update (runner/batch.release, as ModelRunner.fetch does). Page crossings, a table
   that must widen, admissions, aborts, finishes and preemption break or end the continuation; it must still be
   taken on most steady steps.
2. Engine level: two LLMEngines with a fake runner that packs every step (its tokens and logprobs a function of the
   packed arrays, so any packing difference shows in the outputs) get the same workload; the reference has the
   continuation and the engine's shortcuts off (`shortcuts = False`: the per-row lookups at every launch, the
   generations compared at every finish). Every step's outputs and packed buffers must be
   equal: streaming and final-only requests, logprobs and penalties (flagged slots), eos / max_tokens ends,
   aborts mid-run and late arrivals.
"""
import random

import numpy as np
import pytest

from jaxinfer.config.engine import SchedulerConfig
from jaxinfer.engine.engine import LLMEngine
from jaxinfer.engine.input_batch import InputBatch
from jaxinfer.engine.kv_cache import KVCacheManager
from jaxinfer.engine.request import Request
from jaxinfer.engine.scheduler import Scheduler
from jaxinfer.outputs import RunnerOutput
from jaxinfer.runner import batch as batch_mod
from jaxinfer.runner.batch import pack_step
from jaxinfer.runner.buckets import BucketLadder
from jaxinfer.sampling_params import RequestOutputKind, SamplingParams


class SP:
    def __init__(self, max_tokens, stop=None):
        self.max_tokens, self.stop_token_ids, self.ignore_eos, self.min_tokens = max_tokens, stop, False, 0


def _admit_row(rng):
    rows = {}

    def admit(sid):  # a distinct admission row per sequence: the sampling columns differ from row to row
        if sid not in rows:
            rows[sid] = (rng.choice((0.0, 0.7)), rng.choice((-1, 5)), rng.choice((1.0, 0.9)), 0.0,
                         rng.getrandbits(32), 0, 0.0, 0.0, 1.0, False, False)
        return rows[sid]
    return admit


def _counting_continuation(monkeypatch):
    hits = []
    real = batch_mod._pack_continuation

    def counting(*a):
        hits.append(1)
        return real(*a)

    monkeypatch.setattr(batch_mod, "_pack_continuation", counting)
    return hits


@pytest.mark.parametrize("seed", range(10))
def test_continued_steps_equal_full_steps(seed, monkeypatch):
    hits = _counting_continuation(monkeypatch)
    rng = random.Random(seed)
    page_size = rng.choice((1, 3, 4, 16))
    max_len = 160
    num_pages = rng.choice((3 * max_len, 30 * max_len)) // page_size  # (the small pool preempts)
    s = Scheduler(KVCacheManager(num_pages, page_size, enable_prefix_caching=rng.random() < 0.5), 64, 16, max_len,
                  {2})
    s.min_decode_run = 1
    ladder = BucketLadder.build(max_num_batched_tokens=64, max_num_seqs=16, max_model_len=max_len,
                                page_size=page_size, query_tile=4, kv_chunk_pages=4)
    cont, ref = InputBatch(16, rng.choice((2, 8))), InputBatch(16, 8)  # (2: the table widens mid-run)
    ref.continuation = False
    admit = _admit_row(rng)
    for i in range(rng.randrange(3, 12)):
        s.add_request(Request(f"r{i}", [rng.randrange(3, 30) for _ in range(rng.randrange(1, 20))],
                              SP(rng.choice((None, 40, 120)))))
    prev = (None, None)
    in_flight = in_flight_packed = None
    steps = continued = reused = 0
    released = []
    for t in range(220):
        if rng.random() < 0.03:
            s.add_request(Request(f"late{t}", [rng.randrange(3, 30) for _ in range(5)], SP(60)))
        if rng.random() < 0.02 and s.running:  # abort with a step in flight
            s.abort(rng.choice(s.running).request_id)
        out = s.schedule()
        for sid in out.finished_ids + out.preempted_ids:
            cont.remove(sid), ref.remove(sid)
        if not out.is_empty:
            a, rows_a = cont.make_step(out.seqs, admit, prev[0] if in_flight else None, None, out.decodes)
            b, rows_b = ref.make_step(out.seqs, admit, prev[1] if in_flight else None, None, out.decodes)
            where = f"seed {seed} step {t}"
            for f in ("token_ids", "lens", "starts", "rows", "prev_row", "step", "num_spec", "penalty_slot"):
                np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f"{where}: {f}")
                assert getattr(a, f).dtype == getattr(b, f).dtype, (where, f)
            w = min(ref.page_table.shape[1], cont.page_table.shape[1])  # (their widths may differ: zeros past)
            np.testing.assert_array_equal(cont.page_table[:, :w], ref.page_table[:, :w], err_msg=where)
            assert not cont.page_table[:, w:].any() and not ref.page_table[:, w:].any(), where
            for f in ("num_pages", "num_computed"):
                np.testing.assert_array_equal(getattr(cont, f), getattr(ref, f), err_msg=f"{where}: {f}")
            np.testing.assert_array_equal(rows_a, rows_b, err_msg=where)
            assert cont.step_ids == ref.step_ids, where
            bucket = ladder.pick(a.num_tokens, a.num_seqs)
            pa, pb = pack_step(a, bucket, page_size), pack_step(b, bucket, page_size)
            np.testing.assert_array_equal(pa.token_offsets, pb.token_offsets, err_msg=where)
            assert (pa.num_tokens, pa.num_seqs) == (pb.num_tokens, pb.num_seqs), where
            assert set(pa.arrays) == set(pb.arrays)
            for name, arr in pb.arrays.items():
                assert pa.arrays[name].dtype == arr.dtype, (where, name)
                np.testing.assert_array_equal(pa.arrays[name], arr, err_msg=f"{where}: {name}")
            for x, y in zip(pa.flat(), pb.flat()):
                np.testing.assert_array_equal(x, y, err_msg=f"{where}: flat")
            steps += 1
            continued += a.base != 0
            reused += a.base != 0 and pa.buffers[0] is not None and any(pa.buffers[0] is x for x in released)
            prev = (rows_a, rows_b)
        if in_flight is not None:  # the engine's update: the run's tokens as a column (eos now and then)
            run = in_flight.decodes
            tokens = {q.request_id: [2 if rng.random() < 0.01 else rng.randrange(3, 30)] for q in in_flight.scheduled
                      if q.sample}
            if run is not None:
                s.update(in_flight, {k: v for k, v in tokens.items() if k not in set(run.ids)},
                         [tokens[r][0] for r in run.ids])
            else:
                s.update(in_flight, tokens)
            # as ModelRunner.fetch: the finished step's packing may be reused (not that of the step in flight);
            # now and then a runner that does not release
            if rng.random() < 0.9:
                batch_mod.release(in_flight_packed)
                released.append(in_flight_packed.buffers[0])
        in_flight = out if not out.is_empty else None
        in_flight_packed = pa if not out.is_empty else None
    assert steps > 100 and continued > steps // 3, (steps, continued)
    assert len(hits) == continued  # every continued step was packed as one
    assert reused > continued // 3, (reused, continued)  # most of them into a released packing's buffers


class PackingRunner:
    """A fake runner that packs each step as ModelRunner.dispatch does; its sample of a row is a function of the
    row's packed inputs (position, slot, seed, step, sampling columns, page table), and every packing is logged."""

    kv_dtype = "bfloat16"
    num_penalty_slots = 64

    def __init__(self, num_pages, page_size, max_num_seqs, budget, max_len):
        self.num_pages, self.page_size = num_pages, page_size
        self.ladder = BucketLadder.build(max_num_batched_tokens=budget, max_num_seqs=max_num_seqs,
                                         max_model_len=max_len, page_size=page_size, query_tile=4, kv_chunk_pages=4)
        self.log = []

    def dispatch(self, batch, prev=None, prompt_logprob_targets=None):
        hb = pack_step(batch, self.ladder.pick(batch.num_tokens, batch.num_seqs), self.page_size)
        ints, floats = hb.flat()
        self.log.append((ints.copy(), floats.copy()))
        a, n = hb.arrays, hb.num_seqs
        last = hb.token_offsets[1:] - 1
        pt = a["page_tables"][:n].astype(np.int64)
        h = (a["positions"][last].astype(np.int64) * 7919 + a["slot_mapping"][last] * 31 + a["seed"][:n] * 3
             + a["step"][:n] * 131 + a["prev_src"][last] * 17 + a["tile_kv_len"][:n] * 5 + a["top_k"][:n]
             + (a["temperature"][:n] * 1000).astype(np.int64) + (pt * np.arange(1, pt.shape[1] + 1)).sum(1))
        tokens = (h % 300 + 3).astype(np.int32)
        tokens[h % 97 == 0] = 2  # eos now and then
        logprobs = -((h % 13).astype(np.float32) / 8)
        return n, tokens, logprobs, dict(prompt_logprob_targets or {}), hb

    def fetch(self, flight):
        n, tokens, logprobs, targets, hb = flight
        batch_mod.release(hb)  # (as ModelRunner.fetch)
        prompt = {i: (np.full(len(t), -0.5, np.float32), np.zeros((len(t), 20), np.int32),
                      np.full((len(t), 20), -1.0, np.float32)) for i, t in targets.items()}
        return RunnerOutput(tokens, logprobs, np.tile(np.arange(20, dtype=np.int32), (n, 1)),
                            np.full((n, 20), -2.0, np.float32), prompt)


def _engine(reference: bool):
    runner = PackingRunner(400, 4, 24, 128, 120)
    eng = LLMEngine(runner, None, SchedulerConfig(max_num_batched_tokens=128, max_num_seqs=24), max_model_len=120,
                    eos_token_ids={2}, vocab_size=400)
    eng.scheduler.min_decode_run = 4
    if reference:
        eng.input_batch.continuation = False
        eng.shortcuts = False
    return eng


def _params(rng, i, plain_only):
    kind = rng.choice((RequestOutputKind.CUMULATIVE, RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY))
    kw = dict(temperature=rng.choice((0.0, 0.8)), seed=i, max_tokens=rng.randrange(10, 90), output_kind=kind)
    if not plain_only:
        pick = rng.random()
        if pick < 0.15:
            kw["logprobs"] = 2
        elif pick < 0.25:
            kw["presence_penalty"] = 0.5
        elif pick < 0.3:
            kw["prompt_logprobs"] = 1
    return SamplingParams(**kw), rng.random() < 0.7


def _drive(eng, seed):
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 300) for _ in range(rng.randrange(1, 20))] for _ in range(60)]
    nxt = 0
    for _ in range(12):  # a first batch of plain requests: a long run with no flagged slot
        sp, stream = _params(rng, nxt, True)
        eng.add_request(f"r{nxt}", prompts[nxt], sp, stream=stream)
        nxt += 1
    log, step = [], 0
    eng.flagged_seen = []
    while eng.has_unfinished():
        outs = eng.step()
        log.append([(o.request_id, o.finished, [(tuple(c.token_ids), c.text, c.finish_reason, c.stop_reason,
                                                  round(c.cumulative_logprob, 5),
                                                  None if c.logprobs is None else repr(c.logprobs))
                                                 for c in o.outputs], repr(o.prompt_logprobs)) for o in outs])
        step += 1
        eng.flagged_seen.append(eng.input_batch.num_flagged)
        # arrivals (some flagged) while the run goes on: after a finish, one takes the slot freed at the next
        # launch while the finished request's last row is still in flight (its result must be dropped)
        if step > 30 and nxt < len(prompts) and (rng.random() < 0.1 or any(o.finished for o in outs)):
            sp, stream = _params(rng, nxt, False)
            eng.add_request(f"r{nxt}", prompts[nxt], sp, stream=stream)
            nxt += 1
        if step in (20, 57, 90):
            eng.abort(f"r{rng.randrange(nxt)}")
        assert step < 2000
    return log


@pytest.mark.parametrize("seed", range(4))
def test_engine_continuation_and_plain_finish_equal_the_full_paths(seed, monkeypatch):
    hits = _counting_continuation(monkeypatch)
    fast, ref = _engine(False), _engine(True)
    log_ref = _drive(ref, seed)
    assert not hits
    log_fast = _drive(fast, seed)
    assert len(hits) > 30, len(hits)  # the continuation ran
    assert len(fast.runner.log) == len(ref.runner.log)
    for k, (x, y) in enumerate(zip(fast.runner.log, ref.runner.log)):
        for u, v in zip(x, y):
            np.testing.assert_array_equal(u, v, err_msg=f"seed {seed} dispatch {k}")
    assert len(log_fast) == len(log_ref)
    for k, (x, y) in enumerate(zip(log_fast, log_ref)):
        assert x == y, f"seed {seed} step {k}"
    ib = fast.input_batch
    assert ib.num_flagged == int(ib._flagged.sum())
    assert 0 in fast.flagged_seen and max(fast.flagged_seen) > 0  # both ways of _launch ran
