"""The columnar steady-decode step (engine/decode_run.py) against the general scheduler loop.

Two schedulers get the same random pipelined workload (schedule n+1 before update n, as the engine runs): one
with the decode run (the default), one with `columnar = False`. Every step must hand out the same batch (every
field of every ScheduledSeq, the materialized run included), finish the same requests, and leave the requests'
counters, the queues and the KV manager (page lists, free queues, cached hashes) identical. The columnar side is
updated the way the engine updates it (the run's tokens as a column, `sampled` only for the other sequences).
The workloads reach the cases the run must hand back or handle: admissions after a run, page boundaries, a cache
too small (preemption), prefix caching, eos / stop tokens / max_tokens / max_model_len, aborts with a step in
flight. Then the InputBatch: make_step of a run equals make_step of its materialized ScheduledSeqs.
"""
import random

import numpy as np
import pytest

from jaxinfer.engine.input_batch import InputBatch
from jaxinfer.engine.kv_cache import KVCacheManager
from jaxinfer.engine.request import Request
from jaxinfer.engine.scheduler import Scheduler
from tests.engine.test_scheduler_fast_path import add_to_both


class SP:
    def __init__(self, max_tokens, stop, ignore_eos, min_tokens=0):
        self.max_tokens, self.stop_token_ids = max_tokens, stop
        self.ignore_eos, self.min_tokens = ignore_eos, min_tokens


def _seq(q):
    return (q.request_id, q.token_ids, q.start_pos, q.page_table, q.sample, q.is_prefill, q.num_placeholders,
            q.output_index, q.num_spec_tokens, q.request.request_id)


def _req(r):
    return (r.request_id, r.num_computed_tokens, r.num_pending_tokens, list(r.output_token_ids), r.status,
            r.num_preemptions, list(r.page_hashes))


def _kv(kv):
    return (sorted(kv.page_lists.items()), kv.free_pages(), kv.evictable_pages(),
            [kv.page_hash(p) for p in range(kv.num_pages)], [kv.ref_count(p) for p in range(kv.num_pages)])


def _update(s: Scheduler, out, tokens: dict, columnar: bool):
    if columnar and out.decodes is not None:
        run_ids = set(out.decodes.ids)
        sampled = {k: v for k, v in tokens.items() if k not in run_ids}
        # rows whose request left get a junk token: the scheduler must ignore them
        run_tokens = [tokens.get(rid, [99])[0] for rid in out.decodes.ids]
        return s.update(out, sampled, run_tokens)
    return s.update(out, tokens)


@pytest.mark.parametrize("seed", range(30))
def test_decode_run_equals_the_general_loop(seed):
    rng = random.Random(seed)
    page_size = rng.choice((1, 2, 4, 16))
    num_pages = rng.choice((12, 40, 400))
    cfg = dict(max_num_batched_tokens=rng.choice((8, 32, 256)), max_num_seqs=rng.choice((4, 16, 64)),
               max_model_len=rng.choice((48, 96, 200)), eos_token_ids={2})
    prefix = rng.random() < 0.5
    col = Scheduler(KVCacheManager(num_pages, page_size, enable_prefix_caching=prefix), **cfg)
    ref = Scheduler(KVCacheManager(num_pages, page_size, enable_prefix_caching=prefix), **cfg)
    ref.columnar = False
    col.min_decode_run = 1  # every batch size, not only the large ones the engine runs as columns
    shared = [rng.randrange(3, 30) for _ in range(40)]  # a common prefix: prefix-cache hits
    in_flight = None  # (col output, ref output) of the step not yet updated
    runs = rows = 0
    n_req = 0
    for _ in range(150):
        if rng.random() < 0.15:  # add
            prompt = shared[:rng.randrange(0, 40)] + [rng.randrange(3, 30) for _ in range(rng.randrange(1, 20))]
            sp = SP(rng.choice((None, 3, 20, 60)), rng.choice((None, None, [7])), rng.random() < 0.7,
                    rng.choice((0, 0, 2)))
            add_to_both((col, ref), f"r{n_req}", prompt, sp)
            n_req += 1
        if rng.random() < 0.04 and col.running:  # abort with a step in flight
            rid = rng.choice(col.running).request_id
            col.abort(rid), ref.abort(rid)
        outs = (col.schedule(), ref.schedule())
        assert [_seq(q) for q in outs[0].scheduled] == [_seq(q) for q in outs[1].scheduled]
        assert outs[0].preempted_ids == outs[1].preempted_ids
        assert outs[0].num_batched_tokens == outs[1].num_batched_tokens
        assert outs[1].decodes is None
        if outs[0].decodes is not None:
            runs += 1
            rows += len(outs[0].decodes)
        if in_flight is not None:  # update the step before (pipelined), with the same tokens on both sides
            tokens = {q.request_id: [rng.choice((2, 7, rng.randrange(3, 30)))] for q in in_flight[0].scheduled
                      if q.sample}
            fin = [sorted(r.request_id for r in _update(s, o, tokens, s is col))
                   for s, o in zip((col, ref), in_flight)]
            assert fin[0] == fin[1]
        in_flight = outs
        assert [_req(r) for r in col.running] == [_req(r) for r in ref.running]
        assert [_req(r) for r in col.waiting] == [_req(r) for r in ref.waiting]
        assert _kv(col.kv) == _kv(ref.kv)
    if num_pages * page_size >= 150:  # (a tiny cache preempts too often for a run of steady decodes)
        assert runs >= 5 and rows >= 10, (runs, rows)  # the run was exercised


def test_update_rejects_a_misaligned_run():
    s = Scheduler(KVCacheManager(64, 4), 64, 8, 64)
    s.min_decode_run = 1
    for i in range(3):
        s.add_request(Request(f"r{i}", [5, 6, 7], SP(None, None, True)))
    a = s.schedule()
    b = s.schedule()  # first decodes (placeholders)
    s.update(a, {q.request_id: [9] for q in a.scheduled})
    c = s.schedule()
    assert c.decodes is not None and len(c.decodes) == 3
    before = [_req(r) for r in s.running]
    with pytest.raises(ValueError, match="run_tokens has 2 tokens"):
        s.update(c, {}, [1, 2])
    with pytest.raises(RuntimeError, match="call update\\(\\) exactly once per schedule"):
        s.update(c, {}, [1, 2, 3])  # b was never updated: c's samples are one output ahead
    assert [_req(r) for r in s.running] == before  # a bad call changes nothing
    s.update(b, {q.request_id: [9] for q in b.scheduled})
    s.update(c, {}, [1, 2, 3])
    assert [r.output_token_ids for r in s.running] == [[9, 9, 1], [9, 9, 2], [9, 9, 3]]


@pytest.mark.parametrize("seed", range(6))
def test_make_step_of_a_run_equals_its_materialized_seqs(seed):
    rng = random.Random(seed)
    s = Scheduler(KVCacheManager(300, 4), 64, 16, 128)
    s.min_decode_run = 1
    ib_col, ib_ref = InputBatch(16, 8), InputBatch(16, 8)
    admit = lambda sid: (0.0, -1, 1.0, 0.0, 0, 0, 0.0, 0.0, 1.0, False, False)  # noqa: E731
    prev_col = prev_ref = None
    in_flight = None
    seen = 0
    for t in range(60):
        if rng.random() < 0.2:
            s.add_request(Request(f"r{t}", [rng.randrange(3, 30) for _ in range(rng.randrange(1, 12))],
                                  SP(rng.choice((4, 30)), None, True)))
        out = s.schedule()
        for sid in out.finished_ids + out.preempted_ids:  # (the engine frees slots before admitting)
            ib_col.remove(sid), ib_ref.remove(sid)
        if not out.is_empty:
            seen += out.decodes is not None
            a, rows_a = ib_col.make_step(out.seqs, admit, prev_col if in_flight else None, None, out.decodes)
            b, rows_b = ib_ref.make_step(out.scheduled, admit, prev_ref if in_flight else None)
            for f in ("token_ids", "lens", "starts", "rows", "prev_row", "step", "num_spec", "penalty_slot"):
                np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
            np.testing.assert_array_equal(ib_col.page_table, ib_ref.page_table)
            np.testing.assert_array_equal(ib_col.num_pages, ib_ref.num_pages)
            np.testing.assert_array_equal(rows_a, rows_b)
            prev_col, prev_ref = rows_a, rows_b
        if in_flight is not None:
            s.update(in_flight, {q.request_id: [rng.randrange(3, 30)] for q in in_flight.scheduled if q.sample})
        in_flight = out if not out.is_empty else None
    assert seen >= 5


class NoChainScheduler(Scheduler):
    """The decode run without its chain: every run read from the requests (decode_run._fresh_run), the reference
    for the chain's runs (decode_run._next_run, which reads no request)."""

    def schedule(self):
        self._applied = None  # (the chain's precondition: the latest update was the run before's, complete)
        return super().schedule()


@pytest.mark.parametrize("seed", range(12))
def test_chained_runs_equal_fresh_runs_and_the_general_loop(seed, monkeypatch):
    """Long steady stretches (few admissions), so that most runs are the chain's: page crossings, prefix-cache
    registration, eos / stop ids / length ends and aborts in the middle of the chain, then the general loop
    and the chain-less run must agree with it step by step."""
    from jaxinfer.engine import decode_run

    chained = []
    real = decode_run._next_run

    def counting(sched, last):
        run = real(sched, last)
        if isinstance(sched, NoChainScheduler):
            assert run is None
        chained.append(run is not None)
        return run

    monkeypatch.setattr(decode_run, "_next_run", counting)
    rng = random.Random(seed)
    page_size = rng.choice((1, 4, 16))
    cfg = dict(max_num_batched_tokens=64, max_num_seqs=24, max_model_len=rng.choice((60, 200)), eos_token_ids={2})
    prefix = rng.random() < 0.7
    kv = lambda: KVCacheManager(rng_pages, page_size, enable_prefix_caching=prefix)  # noqa: E731
    rng_pages = rng.choice((30, 2000)) if page_size > 1 else 2000
    chain, fresh, ref = Scheduler(kv(), **cfg), NoChainScheduler(kv(), **cfg), Scheduler(kv(), **cfg)
    ref.columnar = False
    chain.min_decode_run = fresh.min_decode_run = 1
    scheds = (chain, fresh, ref)
    shared = [rng.randrange(3, 30) for _ in range(20)]
    for i in range(rng.randrange(4, 20)):
        prompt = shared[:rng.randrange(0, 20)] + [rng.randrange(3, 30) for _ in range(rng.randrange(1, 12))]
        sp = SP(rng.choice((None, 30, 90)), rng.choice((None, None, [7])), rng.random() < 0.5, rng.choice((0, 3)))
        add_to_both(scheds, f"r{i}", prompt, sp)
    in_flight = None
    for t in range(160):
        if rng.random() < 0.03:  # a late arrival (the chain restarts after it)
            add_to_both(scheds, f"late{t}", [rng.randrange(3, 30) for _ in range(5)], SP(40, None, True))
        if rng.random() < 0.02 and chain.running:  # abort with a step in flight
            rid = rng.choice(chain.running).request_id
            for s in scheds:
                s.abort(rid)
        outs = [s.schedule() for s in scheds]
        want = [_seq(q) for q in outs[2].scheduled]
        assert [_seq(q) for q in outs[0].scheduled] == want and [_seq(q) for q in outs[1].scheduled] == want
        if in_flight is not None:
            # eos (2) and the stop id (7) are rare: most requests decode on for many steps
            tokens = {q.request_id: [rng.choice((2, 7)) if rng.random() < 0.02 else rng.randrange(8, 30)]
                      for q in in_flight[2].scheduled if q.sample}
            fin = [sorted(r.request_id for r in _update(s, o, tokens, s is not ref))
                   for s, o in zip(scheds, in_flight)]
            assert fin[0] == fin[1] == fin[2]
        in_flight = outs
        for s in scheds[:2]:
            assert [_req(r) for r in s.running] == [_req(r) for r in ref.running]
            assert [_req(r) for r in s.waiting] == [_req(r) for r in ref.waiting]
            assert _kv(s.kv) == _kv(ref.kv)
    assert sum(chained) >= 20, sum(chained)  # the chain ran
    links, run = 0, chain._last_run
    while run is not None:
        links, run = links + 1, run.prev
    assert links <= 3, links  # the chain keeps no run it no longer reads alive


def test_update_rejects_a_misaligned_run_in_the_chain():
    """The chain trusts the output counts only after the run before's update: an update skipped in the middle of a
    chain is still refused, changing nothing."""
    s = Scheduler(KVCacheManager(64, 4), 64, 8, 64)
    s.min_decode_run = 1
    for i in range(3):
        s.add_request(Request(f"r{i}", [5, 6, 7], SP(None, None, True)))
    a = s.schedule()
    b = s.schedule()
    s.update(a, {q.request_id: [9] for q in a.scheduled})
    prev = b
    outs = []
    for _ in range(4):  # runs: c0 fresh, then the chain
        out = s.schedule()
        s.update(prev, {q.request_id: [9] for q in prev.scheduled} if prev is b else {}, None if prev is b else
                 [9, 9, 9])
        outs.append(out)
        prev = out
    assert all(o.decodes is not None for o in outs) and outs[-1].decodes.prev is outs[-2].decodes
    d = s.schedule()  # outs[-1] is not updated
    assert d.decodes is not None
    before = [_req(r) for r in s.running]
    with pytest.raises(RuntimeError, match="call update\\(\\) exactly once per schedule"):
        s.update(d, {}, [1, 2, 3])
    assert [_req(r) for r in s.running] == before
    s.update(outs[-1], {}, [4, 4, 4])
    s.update(d, {}, [1, 2, 3])
    assert [r.output_token_ids[-2:] for r in s.running] == [[4, 1], [4, 2], [4, 3]]
