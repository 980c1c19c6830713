"""engine/input_batch.InputBatch + runner/batch.pack_step against the from-scratch reference (runner/batch.pack_reference
of the per-request SeqInput list the engine used to build every step), array by array, over random schedules of a
real Scheduler and KVCacheManager: admissions, chunked prefill, pipelined decodes (placeholders), speculative
chunks (with rejected drafts truncating pages), stops, aborts (and a reused id), preemption, prefix-cache hits."""
import random

import numpy as np
import pytest

from jaxinfer.engine.input_batch import InputBatch
from jaxinfer.engine.kv_cache import KVCacheManager
from jaxinfer.engine.request import Request
from jaxinfer.engine.scheduler import Scheduler
from jaxinfer.outputs import SeqInput
from jaxinfer.runner.batch import pack_reference, pack_step
from jaxinfer.runner.buckets import BucketLadder

EOS, VOCAB = 2, 50


class SP:
    def __init__(self, rng: random.Random, max_tokens: int):
        self.max_tokens = max_tokens
        self.stop_token_ids = [5] if rng.random() < 0.3 else None
        self.ignore_eos = rng.random() < 0.3
        self.min_tokens = 0
        greedy = rng.random() < 0.4
        self.temperature = 0.0 if greedy else rng.choice([0.5, 1.0, 1.3])
        self.top_k = rng.choice([-1, 5, 20])
        self.top_p = rng.choice([1.0, 0.9])
        self.min_p = rng.choice([0.0, 0.05])
        self.seed = rng.getrandbits(34)  # above 32 bits: both paths keep the low 32
        self.want_logprobs = rng.random() < 0.2
        pen = rng.random() < 0.3
        self.presence = rng.random() if pen else 0.0
        self.frequency = rng.random() if pen else 0.0
        self.repetition = 1.0 + rng.random() if pen else 1.0
        self.penalised = pen

    def row(self):
        return (self.temperature, self.top_k, self.top_p, self.min_p, self.seed & 0xFFFFFFFF, int(self.want_logprobs),
                self.presence, self.frequency, self.repetition, self.penalised, False)


def reference_seqs(sched, params, prev_rows, pen_slot):
    """The SeqInput list LLMEngine._launch built before the InputBatch (the reference)."""
    seqs = []
    for s in sched.scheduled:
        p = params[s.request_id]
        prev_row = prev_rows[s.request_id] if s.num_placeholders else -1
        inp = SeqInput(s.token_ids, s.start_pos, s.page_table, p.temperature, p.top_k, p.top_p, p.min_p, p.seed,
                       s.output_index, p.want_logprobs, prev_row)
        inp.num_spec = s.num_spec_tokens
        if p.penalised:
            inp.presence_penalty, inp.frequency_penalty = p.presence, p.frequency
            inp.repetition_penalty = p.repetition
            inp.penalty_slot = pen_slot(s.request_id) if s.sample else -1
        seqs.append(inp)
    return seqs


def assert_same_pack(seqs, sb, ladder, page_size, where):
    n_tok = sum(len(s.token_ids) for s in seqs)
    assert sb.num_tokens == n_tok and sb.num_seqs == len(seqs), where
    bucket = ladder.pick(max(n_tok, 1), max(len(seqs), 1))
    want = pack_reference(seqs, bucket, page_size)
    got = pack_step(sb, bucket, page_size)
    np.testing.assert_array_equal(got.token_offsets, want.token_offsets, err_msg=where)
    assert (got.num_tokens, got.num_seqs) == (want.num_tokens, want.num_seqs), where
    assert set(got.arrays) == set(want.arrays), where
    for name, arr in want.arrays.items():
        assert got.arrays[name].dtype == arr.dtype, (where, name)
        np.testing.assert_array_equal(got.arrays[name], arr, err_msg=f"{where}: {name}")
    for a, b in zip(got.flat(), want.flat()):
        np.testing.assert_array_equal(a, b, err_msg=f"{where}: flat buffers")


def drive(seed: int, steps: int = 120, prefix_caching: bool = False, pipelined: bool = True, spec: bool = True):
    rng = random.Random(seed)
    page_size = rng.choice([4, 8])
    max_model_len, max_num_seqs = 96, 8
    num_pages = rng.choice([20, 40, 200])  # small pools preempt
    budget = rng.choice([16, 32, 64])
    kv = KVCacheManager(num_pages, page_size, enable_prefix_caching=prefix_caching)
    sched_ = Scheduler(kv, budget, max_num_seqs, max_model_len, {EOS})
    K = 3
    ladder = BucketLadder.build(max_num_batched_tokens=budget, max_num_seqs=max_num_seqs, max_model_len=max_model_len,
                                page_size=page_size, query_tile=rng.choice([4, 8]), kv_chunk_pages=4,
                                max_spec_seqs=max_num_seqs, num_spec_tokens=K)
    ib = InputBatch(rng.choice([max_num_seqs, 2]), rng.choice([max_model_len // page_size, 3]))  # some grow
    params, reqs, penalty = {}, {}, {}
    next_id, in_flight = 0, None
    stats = dict(steps=0, spec=0, placeholders=0, preempted=0, aborted=0, reused=0, grown_pages=0)
    shared_prefix = [rng.randrange(3, VOCAB) for _ in range(3 * page_size)]

    def pen_slot(rid):
        return penalty.setdefault(rid, len(penalty) % max_num_seqs)

    def finish(step):
        sampled = {}
        for s in step.scheduled:
            if not s.sample:
                continue
            n = rng.randint(1, s.num_spec_tokens + 1) if s.num_spec_tokens else 1
            sampled[s.request_id] = [EOS if rng.random() < 0.03 else rng.randrange(3, VOCAB) for _ in range(n)]
        sched_.update(step, sampled)

    for t in range(steps):
        for _ in range(rng.choice([0, 0, 0, 1, 2])):  # admissions
            if rng.random() < 0.1 and stats["aborted"] and rng.random() < 0.5:
                rid = rng.choice(list(reqs))  # an id seen before: reused if it is no longer queued
                if sched_.get(rid) is not None:
                    continue
                stats["reused"] += 1
            else:
                rid, next_id = f"r{next_id}", next_id + 1
            plen = rng.randint(1, 40)
            prompt = (shared_prefix[:rng.randint(0, len(shared_prefix))] if prefix_caching else []) + \
                [rng.randrange(3, VOCAB) for _ in range(plen)]
            prompt = prompt[:max_model_len - 20]
            p = SP(rng, rng.randint(1, 20))
            req = Request(rid, prompt, p)
            sched_.add_request(req)
            params[rid], reqs[rid] = p, req
        if sched_.running and rng.random() < 0.05:  # abort (maybe while its step is in flight)
            sched_.abort(rng.choice(sched_.running).request_id)
            stats["aborted"] += 1
        speculate = spec and rng.random() < 0.3
        if speculate and in_flight is not None:  # drafts need every token known
            finish(in_flight)
            in_flight = None
        if speculate:
            for r in sched_.running:
                if r.num_computed_tokens == r.num_tokens - 1 and not r.num_pending_tokens:
                    r.spec_token_ids = [rng.randrange(3, VOCAB) for _ in range(rng.randint(1, K))]
        out = sched_.schedule()
        stats["preempted"] += len(out.preempted_ids)
        for rid in out.finished_ids + out.preempted_ids:
            ib.remove(rid)
            penalty.pop(rid, None)
        if out.scheduled:
            prev_rows = in_flight.rows if in_flight is not None else {}
            seqs = reference_seqs(out, params, prev_rows, pen_slot)
            before = ib.page_table.shape
            sb, slot_rows = ib.make_step(out.scheduled, lambda rid: params[rid].row(),
                                         in_flight.slot_rows if in_flight is not None else None)
            stats["grown_pages"] += ib.page_table.shape != before
            for i, s in enumerate(out.scheduled):
                if params[s.request_id].penalised:
                    sb.penalty_slot[i] = pen_slot(s.request_id) if s.sample else -1
                    assert params[s.request_id].penalised == ib.penalised[sb.rows[i]]
            assert_same_pack(seqs, sb, ladder, page_size, f"seed {seed} step {t}")
            stats["steps"] += 1
            stats["spec"] += bool(sb.num_spec.any())
            stats["placeholders"] += int((sb.prev_row >= 0).sum())
            out.rows = {s.request_id: i for i, s in enumerate(out.scheduled) if s.sample}
            out.slot_rows = slot_rows
            assert len(ib) <= max_num_seqs
        if in_flight is not None:
            finish(in_flight)
            in_flight = None
        if out.scheduled:
            if pipelined and not sb.num_spec.any():
                in_flight = out
            else:
                finish(out)
    if in_flight is not None:
        finish(in_flight)
    return stats


@pytest.mark.parametrize("seed", range(12))
def test_step_batch_packs_like_the_reference_over_random_schedules(seed):
    stats = drive(seed, prefix_caching=seed % 3 == 1, pipelined=seed % 4 != 3)
    assert stats["steps"] > 50


def test_random_schedules_cover_the_cases():
    """The schedules above do exercise what they claim (else the equality would prove little)."""
    total = {}
    for seed in range(12):
        for k, v in drive(seed, prefix_caching=seed % 3 == 1, pipelined=seed % 4 != 3).items():
            total[k] = total.get(k, 0) + v
    for k in ("spec", "placeholders", "preempted", "aborted", "reused", "grown_pages"):
        assert total[k] > 0, (k, total)


def test_slots_are_reused_and_page_rows_cleared():
    ib = InputBatch(2, 4)
    row = (0.0, -1, 1.0, 0.0, 0, 0, 0.0, 0.0, 1.0, False, False)

    class S:  # a minimal ScheduledSeq
        def __init__(self, rid, pages, tokens=(1,), start=0):
            self.request_id, self.page_table, self.token_ids, self.start_pos = rid, pages, list(tokens), start
            self.output_index, self.num_spec_tokens, self.num_placeholders, self.sample = 0, 0, 0, True

    sb, _ = ib.make_step([S("a", [3, 4]), S("b", [5])], lambda rid: row, None)
    assert sb.rows.tolist() == [0, 1]
    np.testing.assert_array_equal(ib.page_table[:, :3], [[3, 4, 0], [5, 0, 0]])
    ib.remove("a")
    sb, _ = ib.make_step([S("c", [7]), S("b", [5, 6])], lambda rid: row, None)
    assert sb.rows.tolist() == [0, 1]  # c took a's freed row, whose old pages are gone
    np.testing.assert_array_equal(ib.page_table[:, :3], [[7, 0, 0], [5, 6, 0]])
    sb, _ = ib.make_step([S("d", [8])], lambda rid: row, None)  # a third live slot: the tables grow
    assert ib.num_slots == 4 and sb.rows.tolist() == [2]
    np.testing.assert_array_equal(ib.page_table[:3, :2], [[7, 0], [5, 6], [8, 0]])
