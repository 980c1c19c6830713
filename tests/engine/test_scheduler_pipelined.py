"""Property test of pipelined scheduling: schedule() for step n+1 runs before update() of step n, as the engine
does with async_scheduling. Random adds, aborts and stop-string finishes happen in between.

Checked: pages never leak or serve two requests; a placeholder (-1) appears only for a token the step in flight
is sampling, at most one per sequence and always last; every chunk's page table covers its tokens; known
tokens are the right slice; no chunk computes past max_model_len or samples past max_tokens; everything drains."""

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxinfer.engine.kv_cache import KVCacheManager
from jaxinfer.engine.request import Request
from jaxinfer.engine.scheduler import Scheduler

from tests.engine.test_scheduler_properties import EOS, SP, STOP_ID, VOCAB


def _check_chunk(s: Scheduler, q, in_flight_sampling: set[str]):
    r = s.get(q.request_id)
    n = len(q.token_ids)
    assert q.num_placeholders in (0, 1)
    if q.num_placeholders:
        assert q.request_id in in_flight_sampling, "placeholder without a token in flight"
        assert q.token_ids[-1] == -1 and -1 not in q.token_ids[:-1]
    known = q.token_ids[: n - q.num_placeholders]
    assert known == r.all_token_ids[q.start_pos:q.start_pos + len(known)]
    assert len(q.page_table) * s.kv.page_size >= q.start_pos + n
    # Never compute past the context window (the device's page-table width ends there) and never sample an
    # output the request cannot have.
    assert q.start_pos + n <= s.max_model_len
    if q.sample and r.max_tokens is not None:
        assert q.output_index < r.max_tokens


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_pipelined_random_operations(data):
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    page_size = data.draw(st.integers(1, 4), label="page_size")
    kv = KVCacheManager(data.draw(st.integers(3, 12), label="num_pages"), page_size)
    capacity = kv.num_usable_pages * page_size
    mml = data.draw(st.integers(max(2, capacity // 2), capacity), label="max_model_len")
    s = Scheduler(kv, max_num_batched_tokens=data.draw(st.integers(1, 12), label="budget"),
                  max_num_seqs=data.draw(st.integers(1, 4), label="max_num_seqs"), max_model_len=mml,
                  eos_token_ids={EOS})
    accepted: dict[str, Request] = {}
    finished: set[str] = set()
    in_flight = None  # the SchedulerOutput whose update() is still pending
    counter = 0

    def update(out):
        sampled = {q.request_id: [rng.randrange(VOCAB)] for q in out.scheduled if q.sample}
        for r in s.update(out, sampled):
            finished.add(r.request_id)

    def pipelined_step():
        nonlocal in_flight
        sampling = {q.request_id for q in in_flight.scheduled if q.sample} if in_flight else set()
        out = s.schedule()
        for q in out.scheduled:
            _check_chunk(s, q, sampling)
        if in_flight is not None:
            update(in_flight)
        in_flight = out if out.scheduled else None
        kv.check_invariants()

    for op in data.draw(st.lists(st.sampled_from(["add", "add", "step", "step", "step", "abort", "finish"]),
                                 min_size=5, max_size=50), label="ops"):
        if op == "add":
            rid = f"r{counter}"
            counter += 1
            plen = rng.randint(1, max(1, mml // 2))
            mt = rng.randint(1, max(1, mml - plen))
            r = Request(rid, [rng.randrange(VOCAB) for _ in range(plen)],
                        SP(mt, [STOP_ID] if rng.random() < 0.3 else None, rng.random() < 0.5))
            s.add_request(r)
            accepted[rid] = r
        elif op == "step":
            pipelined_step()
        elif counter:
            rid = f"r{rng.randrange(counter)}"
            r = s.abort(rid) if op == "abort" else s.finish(rid, "stop", "STOP")
            if r is not None:
                finished.add(rid)
    for _ in range(3000):
        if not s.has_unfinished() and in_flight is None:
            break
        pipelined_step()
    assert not s.has_unfinished() and in_flight is None
    assert finished == set(accepted)
    assert kv.num_free_pages == kv.num_usable_pages
    for r in accepted.values():
        assert r.num_pending_tokens == 0 or r.is_finished
        if r.max_tokens is not None:
            assert r.num_output_tokens <= r.max_tokens
        assert r.num_tokens <= mml


class _PositionRunner:
    """A fake device: every sampling row returns the position of the token it samples (start + length of its
    chunk), so each token says which request's step produced it. Takes a StepBatch or a SeqInput list."""
    num_pages, page_size = 64, 4

    def dispatch(self, batch, prev=None, prompt_logprob_targets=None):
        if isinstance(batch, list):
            return [s.start_pos + len(s.token_ids) for s in batch]
        return (batch.starts + batch.lens).tolist()

    def fetch(self, flight):
        import numpy as np

        from jaxinfer.outputs import RunnerOutput

        return RunnerOutput(np.asarray(flight, np.int32), np.zeros(len(flight), np.float32), None, None, {})


def test_engine_id_reused_after_abort_while_its_step_is_in_flight_gets_only_its_own_tokens():
    """Pipelined engine: step n (the old request's prefill, sampling its first token) is in flight when the request
    is aborted and a new one with the same id is added; step n+1 admits the new one before n's tokens are read.
    The new request must get only tokens of its own steps (positions 3, 4, ... of its 3-token prompt), never the
    old request's sample (position 10), and the engine must not fail on the stale row."""
    from jaxinfer.config import SchedulerConfig
    from jaxinfer.engine.engine import LLMEngine
    from jaxinfer.sampling_params import SamplingParams

    eng = LLMEngine(_PositionRunner(), None, SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=4,
                                                             async_scheduling=True),
                    max_model_len=64, eos_token_ids={1}, vocab_size=1000)
    sp = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    for old_outputs in (0, 2):  # aborted in its prefill step, or after a few decodes (output_index > 0)
        eng.add_request("x", list(range(100, 110)), sp)
        outs = []
        for _ in range(1 + old_outputs):
            outs += eng.step()
        assert eng._in_flight is not None  # a step of the old "x" is in flight
        assert eng.abort("x")
        eng.add_request("x", [7, 8, 9], sp)
        eng.add_request("y", [7, 8], sp)
        while eng.has_unfinished():
            outs += eng.step()
        final = {o.request_id: o for o in outs if o.finished}
        assert final["x"].outputs[0].token_ids == [3, 4, 5, 6]
        assert final["y"].outputs[0].token_ids == [2, 3, 4, 5]


class _FailingRunner(_PositionRunner):
    """Raises for any batch holding a row with temperature 0.5 (a stand-in for a row the device step rejects)."""

    def dispatch(self, batch, prev=None, prompt_logprob_targets=None):
        if (batch.sampling["temperature"][batch.rows] == 0.5).any():
            raise ValueError("row rejected")
        if (batch.penalty_slot >= 0).any():
            raise AssertionError("test requests are unpenalised")
        return super().dispatch(batch, prev, prompt_logprob_targets)


def test_engine_row_failing_dispatch_ends_alone_and_the_rest_keep_their_tokens():
    """The dispatch-failure isolation (engine/isolation.py bisection over StepBatch.select) with the plain finish:
    the failing request ends with an error; the others, in the same steps, get exactly their own tokens."""
    from jaxinfer.config import SchedulerConfig
    from jaxinfer.engine.engine import LLMEngine
    from jaxinfer.sampling_params import SamplingParams

    eng = LLMEngine(_FailingRunner(), None, SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=4,
                                                            async_scheduling=True),
                    max_model_len=64, eos_token_ids={1}, vocab_size=1000)
    sp = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    eng.add_request("a", [7, 8, 9], sp)
    outs = eng.step()
    eng.add_request("bad", [7, 8], sp.clone(temperature=0.5))
    eng.add_request("b", [7, 8], sp)
    while eng.has_unfinished():
        outs += eng.step()
    final = {o.request_id: o for o in outs if o.finished}
    assert final["bad"].error and "row rejected" in final["bad"].error
    assert final["a"].outputs[0].token_ids == [3, 4, 5, 6]
    assert final["b"].outputs[0].token_ids == [2, 3, 4, 5]
