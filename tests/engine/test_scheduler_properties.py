"""Property test: random add / schedule+update / abort / finish sequences against a tiny KV cache.

Checked after every operation: no page leaks (free + owned == usable, ref counts 0/1), no page owned twice,
page 0 never used, every scheduled seq's page table covers start_pos + n tokens and its tokens are the right
slice, token budget / max_num_seqs / long_prefill_token_threshold respected, a preempted request is never in
the same batch, every schedule() with unfinished requests makes progress. At the end, stepping drains every
request: each accepted request finishes exactly once (aborted by us, or stopped / length)."""

import random
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxinfer.engine.kv_cache import KVCacheManager
from jaxinfer.engine.request import Request, RequestStatus
from jaxinfer.engine.scheduler import Scheduler

EOS = 2
STOP_ID = 5
VOCAB = 40  # small vocabulary so eos / stop ids come up now and then


@dataclass
class SP:
    max_tokens: int | None
    stop_token_ids: list[int] | None
    ignore_eos: bool


class Harness:
    def __init__(self, s: Scheduler, rng: random.Random):
        self.s, self.kv, self.rng = s, s.kv, rng
        self.accepted: dict[str, Request] = {}
        self.finished: dict[str, Request] = {}   # request_id -> request, each exactly once
        self.aborted_by_us: set[str] = set()
        self.n = 0

    # -- operations --
    def add(self, prompt_len, max_tokens, stop, ignore_eos):
        s, kv = self.s, self.kv
        rid = f"r{self.n}"
        self.n += 1
        r = Request(rid, [self.rng.randrange(VOCAB) for _ in range(prompt_len)],
                    SP(max_tokens, [STOP_ID] if stop else None, ignore_eos))
        total = prompt_len + max_tokens if max_tokens is not None else s.max_model_len
        ok = (prompt_len >= 1 and total <= s.max_model_len and (max_tokens is not None or prompt_len < s.max_model_len)
              and kv.pages_needed(total) <= kv.num_usable_pages)
        try:
            s.add_request(r)
        except ValueError:
            assert not ok, f"{rid} rejected but fits"
            assert s.get(rid) is None
            return
        assert ok, f"{rid} accepted but can never fit"
        self.accepted[rid] = r

    def step(self, abort_in_between=False):
        s = self.s
        unfinished_before = s.has_unfinished()
        running_before = [r.request_id for r in s.running]
        waiting_before = [r.request_id for r in s.waiting]
        out = s.schedule()
        self.check_output(out)
        # Order: a prefix of running (in order), then a prefix of waiting (FIFO, no skipping); victims are
        # taken from the back of running; nothing is admitted in a step that preempted.
        ids = [q.request_id for q in out.scheduled]
        m = sum(1 for rid in ids if rid in running_before)
        k, p = len(ids) - m, len(out.preempted_ids)
        assert ids == running_before[:m] + waiting_before[:k]
        assert out.preempted_ids == running_before[::-1][:p] and m + p <= len(running_before)
        assert not (p and k)
        # Queues afterwards: victims at the front of waiting (the earliest started first), the rest unchanged.
        assert [r.request_id for r in s.waiting] == out.preempted_ids[::-1] + waiting_before[k:]
        assert [r.request_id for r in s.running] == running_before[:len(running_before) - p] + waiting_before[:k]
        if unfinished_before:
            assert out.scheduled, "no progress although requests are unfinished"
        self.check_state()
        if abort_in_between and out.scheduled:
            self.abort(self.rng.choice(out.scheduled).request_id)
        sampled = {q.request_id: [self.rng.randrange(VOCAB) for _ in range(self.rng.choice((1, 1, 1, 2, 3)))]
                   for q in out.scheduled if q.sample}
        for r in s.update(out, sampled):
            self.record_finished(r)
            assert r.status in (RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH)
            last = r.output_token_ids[-1]
            if r.status is RequestStatus.FINISHED_STOPPED:
                assert last == r.stop_reason == STOP_ID or (last == EOS and r.stop_reason is None
                                                            and not r.sampling.ignore_eos)
            else:
                assert (r.num_output_tokens == r.max_tokens) or r.num_tokens == s.max_model_len
        self.check_state()

    def abort(self, rid):
        r = self.s.abort(rid)
        if rid in self.accepted and rid not in self.finished:
            assert r is self.accepted[rid] and r.status is RequestStatus.FINISHED_ABORTED
            self.aborted_by_us.add(rid)
            self.record_finished(r)
        else:
            assert r is None
        self.check_state()

    def finish_stop_string(self, rid):
        r = self.s.finish(rid, "stop", stop_reason="STOP")
        if rid in self.accepted and rid not in self.finished:
            assert r is self.accepted[rid] and r.stop_reason == "STOP"
            self.record_finished(r)
        else:
            assert r is None
        self.check_state()

    def record_finished(self, r):
        assert r.request_id not in self.finished, f"{r.request_id} finished twice"
        assert r.is_finished and self.kv.page_table(r.request_id) == []
        if r.max_tokens is not None:
            assert r.num_output_tokens <= r.max_tokens
        assert r.num_tokens <= self.s.max_model_len
        self.finished[r.request_id] = r

    # -- checks --
    def check_output(self, out):
        s, kv = self.s, self.kv
        assert out.num_batched_tokens == sum(q.num_tokens for q in out.scheduled) <= s.max_num_batched_tokens
        assert len(out.scheduled) <= s.max_num_seqs
        ids = [q.request_id for q in out.scheduled]
        assert len(set(ids)) == len(ids)
        assert not set(ids) & set(out.preempted_ids), "preempted request scheduled in the same step"
        for rid in out.preempted_ids:
            assert s.get(rid).status is RequestStatus.PREEMPTED and s.get(rid).num_computed_tokens == 0
        seen_pages = set()
        for q in out.scheduled:
            r = s.get(q.request_id)
            n = q.num_tokens
            assert r.status is RequestStatus.RUNNING and n >= 1
            if s.long_prefill_token_threshold is not None:
                assert n <= s.long_prefill_token_threshold
            assert q.start_pos + n == r.num_computed_tokens  # advanced by schedule() itself
            assert q.token_ids == r.all_token_ids[q.start_pos:q.start_pos + n]
            assert len(q.page_table) * kv.page_size >= q.start_pos + n
            assert q.page_table == kv.page_table(q.request_id) and 0 not in q.page_table
            assert not seen_pages & set(q.page_table), "one page in two requests' page tables"
            seen_pages |= set(q.page_table)
            assert q.sample == (q.start_pos + n == r.num_tokens)
            assert q.is_prefill == (n > 1 or q.start_pos == 0)

    def check_state(self):
        s, kv = self.s, self.kv
        kv.check_invariants()
        assert len(s.running) <= s.max_num_seqs
        owners = kv.owners()
        running_ids = {r.request_id for r in s.running}
        assert set(owners) <= running_ids, "a waiting or finished request holds pages"
        for r in s.running:
            assert r.status is RequestStatus.RUNNING
            assert kv.num_pages_of(r.request_id) >= kv.pages_needed(r.num_computed_tokens)
            assert r.num_computed_tokens <= r.num_tokens
        for r in s.waiting:
            assert r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED) and r.num_computed_tokens == 0
        unfinished = set(self.accepted) - set(self.finished)
        assert {r.request_id for r in s.waiting} | running_ids == unfinished
        assert len(s.waiting) + len(s.running) == len(unfinished)
        st_ = s.stats()
        assert (st_.num_running, st_.num_waiting, st_.num_free_pages) == (
            len(s.running), len(s.waiting), kv.num_free_pages)


OPS = ["add", "add", "add", "step", "step", "step", "step", "step_abort", "abort", "finish"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_operations_never_leak_and_always_drain(data):
    page_size = data.draw(st.integers(1, 4), label="page_size")
    num_pages = data.draw(st.integers(2, 12), label="num_pages")
    kv = KVCacheManager(num_pages, page_size)
    # max_model_len mostly <= the cache: each request fits alone, several together overflow it (preemption);
    # sometimes larger, so max_tokens=None requests get rejected.
    capacity = kv.num_usable_pages * page_size
    mml = data.draw(st.integers(max(2, capacity // 2), capacity + 2), label="max_model_len")
    s = Scheduler(kv, max_num_batched_tokens=data.draw(st.integers(1, 12), label="budget"),
                  max_num_seqs=data.draw(st.integers(1, 4), label="max_num_seqs"), max_model_len=mml,
                  eos_token_ids={EOS},
                  long_prefill_token_threshold=data.draw(st.none() | st.integers(1, 6), label="threshold"))
    h = Harness(s, random.Random(data.draw(st.integers(0, 2**32 - 1), label="seed")))

    for op in data.draw(st.lists(st.sampled_from(OPS), min_size=10, max_size=60), label="ops"):
        if op == "add":
            h.add(data.draw(st.integers(0, mml // 2 + 1)), data.draw(st.none() | st.integers(1, mml // 2 + 1)),
                  data.draw(st.booleans()), data.draw(st.booleans()))
        elif op in ("step", "step_abort"):
            h.step(abort_in_between=op == "step_abort")
        elif op in ("abort", "finish") and h.n:
            rid = f"r{data.draw(st.integers(0, h.n - 1))}"
            h.abort(rid) if op == "abort" else h.finish_stop_string(rid)

    # Drain: every accepted request must finish (no deadlock, no dropped request).
    for _ in range(2000):
        if not s.has_unfinished():
            break
        h.step()
    assert not s.has_unfinished(), f"not drained: running={s.running} waiting={list(s.waiting)}"
    assert set(h.finished) == set(h.accepted)
    assert {rid for rid, r in h.finished.items() if r.status is RequestStatus.FINISHED_ABORTED} == h.aborted_by_us
    assert kv.num_free_pages == kv.num_usable_pages
    kv.check_invariants()


def test_seeded_stress_exercises_preemption():
    """Longer random runs than hypothesis tends to build, on caches sized to force preemption; the same
    per-operation checks, plus: preemption, recompute and chunked prefill really happened."""
    total_preemptions = recomputed = 0
    for seed in range(60):
        rng = random.Random(seed)
        page_size = rng.randint(1, 4)
        kv = KVCacheManager(rng.randint(3, 10), page_size)
        capacity = kv.num_usable_pages * page_size
        mml = rng.randint(max(2, capacity // 2), capacity)
        s = Scheduler(kv, max_num_batched_tokens=rng.randint(1, 10), max_num_seqs=rng.randint(2, 6),
                      max_model_len=mml, eos_token_ids={EOS},
                      long_prefill_token_threshold=rng.choice([None, None, rng.randint(1, 4)]))
        h = Harness(s, rng)
        for _ in range(150):
            op = rng.choice(OPS)
            if op == "add":
                h.add(rng.randint(1, mml // 2 + 1), rng.choice([None, rng.randint(1, mml // 2 + 1)]),
                      rng.random() < 0.3, rng.random() < 0.5)
            elif op in ("step", "step_abort"):
                h.step(abort_in_between=op == "step_abort" and rng.random() < 0.3)
            elif h.n and rng.random() < 0.3:
                rid = f"r{rng.randrange(h.n)}"
                h.abort(rid) if op == "abort" else h.finish_stop_string(rid)
        for _ in range(5000):
            if not s.has_unfinished():
                break
            h.step()
        assert not s.has_unfinished() and set(h.finished) == set(h.accepted)
        assert kv.num_free_pages == kv.num_usable_pages
        total_preemptions += s.stats().num_preemptions_total
        recomputed += sum(1 for r in h.finished.values() if r.num_preemptions and not r.status.name.endswith("ABORTED"))
    assert total_preemptions >= 300 and recomputed >= 150, (total_preemptions, recomputed)
