"""Scheduler.schedule inlines its common case (a running request's decode or prefill chunk whose pages are already
held, no drafts) for speed. This test runs random workloads through it and through a reference scheduler whose
running loop is the general form (_chunk, _drafts, _allocate_or_preempt, _make_seq for every request, as before the
inlining), side by side, and requires identical outputs every step: every field of every ScheduledSeq, the
preempted ids, and the requests' counters. The workloads pipeline (schedule n+1 before update n: placeholders),
carry drafts (speculative chunks, rollback), preempt (a tiny cache), chunk long prompts and finish by length and
stop tokens."""
import random

import pytest

from jaxinfer.engine.kv_cache import KVCacheManager
from jaxinfer.engine.request import Request
from jaxinfer.engine.scheduler import Scheduler


class GeneralScheduler(Scheduler):
    """The running loop as it was before the inlining (the reference): the general helpers for every request."""

    def _schedule_running(self, budget, scheduled, preempted):
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = self._chunk(req, budget)
            if n <= 0:
                i += 1
                continue
            spec = self._drafts(req, n, budget) if req.spec_token_ids else ()
            n += len(spec)
            if not self._allocate_or_preempt(req, n, preempted):
                break
            scheduled.append(self._make_seq(req, n, spec))
            budget -= n
            i += 1
        return budget


def add_to_both(schedulers, request_id, prompt, sp) -> None:
    """Queue the same request on each scheduler; all must accept it or all refuse it (ValueError)."""
    accepted = []
    for s in schedulers:
        try:
            s.add_request(Request(request_id, list(prompt), sp))
            accepted.append(True)
        except ValueError:
            accepted.append(False)
    assert len(set(accepted)) == 1, accepted


def _seq_fields(q):
    return (q.request_id, q.token_ids, q.start_pos, q.page_table, q.sample, q.is_prefill, q.num_placeholders,
            q.output_index, q.num_spec_tokens)


def _req_fields(r):
    return (r.request_id, r.num_computed_tokens, r.num_pending_tokens, list(r.output_token_ids), r.status,
            r.num_preemptions)


@pytest.mark.parametrize("seed", range(40))
def test_inlined_schedule_equals_the_general_form(seed):
    rng = random.Random(seed)
    page_size = rng.choice((1, 2, 4, 16))
    num_pages = rng.randrange(6, 40)
    cfg = dict(max_num_batched_tokens=rng.choice((3, 8, 32, 256)), max_num_seqs=rng.choice((2, 4, 16)),
               max_model_len=rng.choice((24, 48, 96)), eos_token_ids={2},
               long_prefill_token_threshold=rng.choice((None, None, 3, 7)))
    fast = Scheduler(KVCacheManager(num_pages, page_size, enable_prefix_caching=rng.random() < 0.5), **cfg)
    ref = GeneralScheduler(KVCacheManager(num_pages, page_size,
                                          enable_prefix_caching=fast.kv.enable_prefix_caching), **cfg)
    fast.columnar = ref.columnar = False  # the inlined loop itself (the columnar decode run: test_decode_run.py)

    class SP:
        def __init__(self, max_tokens, stop, ignore_eos):
            self.max_tokens, self.stop_token_ids, self.ignore_eos = max_tokens, stop, ignore_eos

    in_flight = []  # (fast output, ref output) not yet updated: pipelining when it holds one
    n_req = 0
    for _ in range(120):
        op = rng.random()
        if op < 0.2:
            prompt = [rng.randrange(3, 30) for _ in range(rng.randrange(1, 30))]
            sp = SP(rng.choice((None, 1, 4, 12)), rng.choice((None, [7])), rng.random() < 0.5)
            add_to_both((fast, ref), f"r{n_req}", prompt, sp)
            n_req += 1
            continue
        # drafts on some decode-ready requests (same ones on both sides)
        if rng.random() < 0.3:
            for a, b in zip(fast.running, ref.running):
                if rng.random() < 0.5:
                    d = [rng.randrange(3, 30) for _ in range(rng.randrange(1, 4))]
                    a.spec_token_ids, b.spec_token_ids = list(d), list(d)
        outs = (fast.schedule(), ref.schedule())
        assert [_seq_fields(q) for q in outs[0].scheduled] == [_seq_fields(q) for q in outs[1].scheduled]
        assert outs[0].preempted_ids == outs[1].preempted_ids
        assert outs[0].num_batched_tokens == outs[1].num_batched_tokens
        in_flight.append(outs)
        # update the oldest step: at once, or one step late (pipelined), like the engine
        while len(in_flight) > (1 if rng.random() < 0.6 else 0):
            fo, ro = in_flight.pop(0)
            sampled = {}
            for q in fo.scheduled:
                if q.sample:
                    k = q.num_spec_tokens
                    sampled[q.request_id] = [rng.randrange(2, 30) for _ in range(rng.randrange(1, k + 2))]
            fin = (sorted(r.request_id for r in fast.update(fo, sampled)),
                   sorted(r.request_id for r in ref.update(ro, sampled)))
            assert fin[0] == fin[1]
        assert [_req_fields(r) for r in fast.running] == [_req_fields(r) for r in ref.running]
        assert [_req_fields(r) for r in fast.waiting] == [_req_fields(r) for r in ref.waiting]
