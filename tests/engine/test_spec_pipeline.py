"""engine/spec_pipeline.py on the host, exactly: a verification step n+1 scheduled while step n is in flight gets
the worst-case chunk and pages; after update(step n) the one-step-late reconcile puts its chunk where the device ran
it (start_pos / output_index moved by step n's rejected drafts), pages go back to what the real count needs, and
preemption / abort / max_tokens with a step in flight leave no page behind. Pure host code."""
from dataclasses import dataclass

from jaxinfer.engine import spec_pipeline
from jaxinfer.engine.kv_cache import KVCacheManager
from jaxinfer.engine.request import Request
from jaxinfer.engine.scheduler import Scheduler
from jaxinfer.engine.spec_control import SpecControl
from tests.engine.test_spec_scheduler import SP  # the sampling-params stub of the scheduler tests


class _Dev:
    def propose_device(self, flight, todo):
        self.todo = todo
        return flight

    def rollback(self, rid, n):
        pass

    def free(self, rid):
        pass


@dataclass
class _Step:  # the engine's _Step, as far as spec_pipeline reads it
    sched: object
    rows: dict
    pipe: object = None


def _setup(k=3, page_size=4, num_pages=64, max_tokens=32):
    kv = KVCacheManager(num_pages, page_size)
    s = Scheduler(kv, 64, 8, 256, {2})
    ctl = SpecControl(_Dev(), k, 8, adaptive=False)
    return s, ctl


def _step(s, ctl, prev):
    """prepare (if a step is in flight) + schedule, as LLMEngine.step does; returns the new _Step."""
    plan = None
    if prev is not None:
        plan = prev.pipe = spec_pipeline.prepare(ctl, s.running, prev, lambda rid: SP(), prev.rows.get)
    sched = s.schedule()
    if plan is not None:
        spec_pipeline.device_drafts(ctl.proposer, plan, sched, None, s.get)
    return _Step(sched, {q.request_id: i for i, q in enumerate(sched.scheduled) if q.sample})


def _finish(s, done, sampled, nxt):
    spec_pipeline.unbump(done.pipe, s)
    fin = s.update(done.sched, sampled)
    spec_pipeline.reconcile(done.pipe, done.sched, sampled, nxt.sched if nxt is not None else None)
    return fin


def test_worst_case_chunk_then_reconcile():
    s, ctl = _setup(k=3, page_size=4)
    r = Request("a", [100, 101, 102, 103, 104], SP())
    s.add_request(r)
    n0 = _step(s, ctl, None)  # prefill: samples output 0 (token position 5)
    n1 = _step(s, ctl, n0)  # pipelined: [placeholder, 3 drafts] at 5..8
    (q1,) = n1.sched.scheduled
    assert (q1.start_pos, q1.num_spec_tokens, q1.num_placeholders, q1.output_index) == (5, 3, 1, 1)
    (todo,) = ctl.proposer.todo
    assert todo[:5] == ("a", 0, 6, 3, 0) and todo[5]() == [100, 101, 102, 103, 104]  # exact count
    _finish(s, n0, {"a": [7]}, n1)
    assert q1.start_pos == 5  # step 0 verified nothing: no shift
    n2 = _step(s, ctl, n1)  # worst case: step 1 accepted all 3 -> 5 + 4 = 9 known-or-pending before the next chunk
    (q2,) = n2.sched.scheduled
    assert (q2.start_pos, q2.output_index, q2.num_spec_tokens) == (9, 5, 3)
    assert len(q2.page_table) == 4 and r.num_computed_tokens == 13  # positions 9..12 -> pages for 13 tokens
    assert [t[:5] for t in ctl.proposer.todo] == [("a", 0, 10, 3, 3)]  # worst case: step 1 verifies 3
    _finish(s, n1, {"a": [8, 60]}, n2)  # 1 of 3 accepted: 2 rejected
    assert r.output_token_ids == [7, 8, 60]
    assert (q2.start_pos, q2.output_index) == (7, 3)  # where the device ran it
    assert r.num_computed_tokens == 11 and s.kv.num_pages_of("a") == 3  # 11 tokens (7..10 for step 2's chunk)
    assert r.num_pending_tokens == 1
    n3 = _step(s, ctl, n2)
    (q3,) = n3.sched.scheduled
    assert q3.start_pos == 11 and q3.output_index == 7  # worst case of step 2 again
    _finish(s, n2, {"a": [61, 62, 63, 64]}, n3)  # all accepted
    assert (q3.start_pos, q3.output_index) == (11, 7) and r.num_computed_tokens == 15
    _finish(s, n3, {"a": [70]}, None)  # all rejected, nothing in flight after it
    assert r.output_token_ids == [7, 8, 60, 61, 62, 63, 64, 70]
    assert r.num_computed_tokens == r.num_tokens - 1 == 12 and r.num_pending_tokens == 0
    assert s.kv.num_pages_of("a") == 3  # the pages of rejected positions 13, 14 went back
    s.kv.check_invariants()


def test_max_tokens_preemption_and_abort_with_a_step_in_flight():
    s, ctl = _setup(k=3, page_size=4, num_pages=24)
    a = Request("a", [100] * 5, SP(max_tokens=6))
    b = Request("b", [200] * 5, SP(max_tokens=20))
    for r in (a, b):
        s.add_request(r)
    n0 = _step(s, ctl, None)
    n1 = _step(s, ctl, n0)
    ka = {q.request_id: q.num_spec_tokens for q in n1.sched.scheduled}
    assert ka["a"] == 3  # output 0 pending: room for 4 more drafts under max_tokens, k = 3
    _finish(s, n0, {"a": [7], "b": [8]}, n1)
    n2 = _step(s, ctl, n1)  # a: worst case already 5 outputs -> k = 0 (the bonus is the 6th)
    qa = [q for q in n2.sched.scheduled if q.request_id == "a"]
    assert qa and qa[0].num_spec_tokens == 0
    _finish(s, n1, {"a": [9, 10, 11, 12], "b": [13]}, n2)
    assert len(a.output_token_ids) == 5
    n3 = _step(s, ctl, n2)  # a: its 6th output is in flight: not scheduled
    assert [q.request_id for q in n3.sched.scheduled] == ["b"]
    s.abort("b")
    fin = _finish(s, n2, {"a": [14]}, n3)
    assert [r.request_id for r in fin] == ["a"] and a.output_token_ids == [7, 9, 10, 11, 12, 14]
    _finish(s, n3, {q.request_id: [1] for q in n3.sched.scheduled if q.sample}, None)
    assert s.kv.num_used_pages == 0
    s.kv.check_invariants()
