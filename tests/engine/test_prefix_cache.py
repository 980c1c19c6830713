"""Automatic prefix caching: exact host-level behaviour of KVCacheManager + Scheduler, a property test that
simulates the device KV content (lock-step and pipelined), and an engine-level equality test on the tiny Llama.

Conventions: page_size 4 unless said otherwise; `run_to_end` drives lock-step schedule()/update() with
fixed sampled tokens."""

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxinfer.engine.kv_cache import KVCacheManager, hash_page, root_hash
from jaxinfer.engine.request import Request, RequestStatus
from jaxinfer.engine.scheduler import Scheduler

from tests.engine.test_scheduler_properties import EOS, SP, STOP_ID, VOCAB


def make(num_pages=20, page_size=4, budget=64, max_num_seqs=8, mml=64, **kw):
    kv = KVCacheManager(num_pages, page_size, enable_prefix_caching=True, **kw)
    return kv, Scheduler(kv, budget, max_num_seqs, mml, eos_token_ids={EOS})


def req(rid, prompt, max_tokens=1):
    return Request(rid, list(prompt), SP(max_tokens, None, True))


def step(s, tok=7):
    out = s.schedule()
    fin = s.update(out, {q.request_id: [tok] for q in out.scheduled if q.sample})
    return out, fin


def run_to_end(s, tok=7, limit=200):
    for _ in range(limit):
        if not s.has_unfinished():
            return
        step(s, tok)
    raise AssertionError("did not drain")


def seq_of(out, rid):
    return next(q for q in out.scheduled if q.request_id == rid)


BASE = list(range(100, 140))  # 40 distinct token ids


# ---- hashing -------------------------------------------------------------------------------------------------
def test_hash_chain_is_stable_and_keyed():
    kv = KVCacheManager(8, 4, enable_prefix_caching=True, extra_key="bf16")
    hs = []
    kv.extend_hashes(hs, lambda a, b: BASE[a:b], 3)
    assert len(hs) == 3 and len(set(hs)) == 3
    assert hs[0] == hash_page(root_hash("bf16"), BASE[0:4])
    assert hs[2] == hash_page(hash_page(hash_page(root_hash("bf16"), BASE[:4]), BASE[4:8]), BASE[8:12])
    assert hash_page(root_hash("bf16"), BASE[:4]) == hash_page(root_hash("bf16"), BASE[:4])  # deterministic
    assert root_hash("bf16") != root_hash("f32") and root_hash(None) != root_hash("bf16")
    # chained: the same page content after a different prefix hashes differently
    assert hash_page(hs[0], BASE[4:8]) != hash_page(root_hash("bf16"), BASE[4:8])
    other = KVCacheManager(8, 4, enable_prefix_caching=True, extra_key="f32")
    hs2 = []
    other.extend_hashes(hs2, lambda a, b: BASE[a:b], 1)
    assert hs2[0] != hs[0]


# ---- hits ----------------------------------------------------------------------------------------------------
def test_shared_prefix_hit_reuses_pages_and_sets_num_computed():
    kv, s = make()
    s.add_request(req("a", BASE[:10]))           # pages 1,2 full; page 3 holds tokens 8,9
    out, _ = step(s)
    assert seq_of(out, "a").page_table == [1, 2, 3]
    run_to_end(s)
    assert kv.page_hash(1) is not None and kv.page_hash(2) is not None and kv.page_hash(3) is None
    assert kv.free_pages() == [4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 3, 2, 1]
    assert kv.evictable_pages() == [2, 1]

    s.add_request(req("b", BASE[:8] + [5, 6, 7, 8, 9]))   # 13 tokens, shares 2 full pages
    out, _ = step(s)
    q = seq_of(out, "b")
    assert q.page_table == [1, 2, 4, 5] and q.start_pos == 8 and q.token_ids == [5, 6, 7, 8, 9]
    assert s.get("b") is None or s.get("b").num_computed_tokens == 13
    st_ = s.stats()
    assert (st_.prefix_cache_queries, st_.prefix_cache_hits, st_.prefix_cache_hit_requests) == (10 + 13, 8, 1)
    assert st_.prefix_cache_hit_rate == pytest.approx(8 / 23)
    kv.check_invariants()


def test_partial_last_page_not_reused():
    kv, s = make()
    s.add_request(req("a", BASE[:6]))   # page 1 full, page 2 half
    run_to_end(s)
    assert kv.num_cached_pages == 1
    s.add_request(req("b", BASE[:12]))
    out, _ = step(s)
    q = seq_of(out, "b")
    assert q.start_pos == 4 and q.page_table[0] == 1 and q.token_ids == BASE[4:12]
    assert 2 not in q.page_table or q.page_table.index(2) > 0


def test_at_least_one_token_is_computed():
    kv, s = make()
    s.add_request(req("a", BASE[:12]))   # 3 full pages
    run_to_end(s)
    assert kv.num_cached_pages == 3
    s.add_request(req("same", BASE[:12]))          # identical: cap at (12-1)//4 = 2 pages
    out, _ = step(s)
    q = seq_of(out, "same")
    assert q.start_pos == 8 and q.token_ids == BASE[8:12] and q.sample and q.page_table[:2] == [1, 2]
    assert q.page_table[2] != 3                    # the last page is recomputed into a fresh page
    run_to_end(s)
    s.add_request(req("one-more", BASE[:13]))      # 13 tokens: all 3 cached pages, compute 1 token
    out, _ = step(s)
    q = seq_of(out, "one-more")
    assert q.start_pos == 12 and q.token_ids == [BASE[12]] and q.page_table[:3] == [1, 2, 3]
    assert not q.is_prefill  # a single token at a non-zero position
    s.add_request(req("short", BASE[:3]))          # shorter than a page: nothing to look up
    out, _ = step(s)
    assert seq_of(out, "short").start_pos == 0


def test_outputs_are_cached_too_and_prefix_of_generation_hits():
    kv, s = make()
    s.add_request(req("a", BASE[:6], max_tokens=6))   # prompt 6 + outputs 7,7,7,7,7,(7) -> 11 computed
    run_to_end(s, tok=7)
    a_tokens = BASE[:6] + [7] * 6
    # 11 tokens computed (the last sampled token never is): pages 1 and 2 full -> cached
    assert kv.num_cached_pages == 2
    s.add_request(req("b", a_tokens[:9] + [1, 1, 1]))
    out, _ = step(s)
    q = seq_of(out, "b")
    assert q.start_pos == 8 and q.page_table[:2] == [1, 2]


def test_bypass_flag_computes_everything():
    kv, s = make()
    s.add_request(req("a", BASE[:12]))
    run_to_end(s)
    r = req("lp", BASE[:12])
    r.use_prefix_cache = False
    s.add_request(r)
    out, _ = step(s)
    q = seq_of(out, "lp")
    assert q.start_pos == 0 and q.token_ids == BASE[:12]
    assert s.stats().prefix_cache_queries == 12  # the bypassing request is not counted


def test_disabled_manager_never_hits():
    kv = KVCacheManager(20, 4)
    s = Scheduler(kv, 64, 8, 64)
    s.add_request(req("a", BASE[:12]))
    run_to_end(s)
    s.add_request(req("b", BASE[:12]))
    out, _ = step(s)
    assert seq_of(out, "b").start_pos == 0 and kv.num_cached_pages == 0
    assert s.stats().prefix_cache_queries == 0


# ---- pipelining: a page becomes cacheable only after update() of the step that computed it ---------------------
def test_pages_registered_only_after_their_step_returns():
    kv, s = make()
    s.add_request(req("a", BASE[:12], max_tokens=3))
    out1 = s.schedule()                       # a's prefill in flight
    assert kv.num_cached_pages == 0
    s.add_request(req("b", BASE[:12]))
    out2 = s.schedule()                       # a's decode (placeholder) + b admitted: no hit yet
    assert seq_of(out2, "b").start_pos == 0
    assert kv.num_cached_pages == 0
    s.update(out1, {"a": [7]})                # step 1 came back: a's 3 full pages are cached
    assert kv.num_cached_pages == 3
    s.add_request(req("c", BASE[:12] + [1]))
    out3 = s.schedule()
    q = seq_of(out3, "c")
    assert q.start_pos == 12 and q.page_table[:3] == seq_of(out1, "a").page_table[:3]
    s.update(out2, {"a": [7], "b": [7]})
    # b computed the same 3 pages concurrently: they stay unhashed (a's pages hold those hashes)
    assert kv.num_cached_pages == 3
    assert all(kv.page_hash(p) is None for p in seq_of(out2, "b").page_table)
    s.update(out3, {q.request_id: [7] for q in out3.scheduled if q.sample})
    run_to_end(s)
    kv.check_invariants()
    assert kv.num_free_pages == kv.num_usable_pages


def test_request_aborted_in_flight_registers_nothing():
    kv, s = make()
    s.add_request(req("a", BASE[:12], max_tokens=3))
    out = s.schedule()
    s.abort("a")
    s.update(out, {})
    assert kv.num_cached_pages == 0 and kv.num_free_pages == kv.num_usable_pages


# ---- ref counts / eviction -----------------------------------------------------------------------------------
def test_shared_page_freed_only_when_both_finish():
    kv, s = make()
    s.add_request(req("a", BASE[:8], max_tokens=1))
    run_to_end(s)                                      # pages 1, 2 cached (evictable)
    s.add_request(req("b", BASE[:8] + [1, 2], max_tokens=20))
    s.add_request(req("c", BASE[:8] + [3, 4], max_tokens=20))
    out, _ = step(s)
    assert seq_of(out, "b").page_table[:2] == [1, 2] and seq_of(out, "c").page_table[:2] == [1, 2]
    assert kv.ref_count(1) == kv.ref_count(2) == 2 and kv.evictable_pages() == []
    kv.check_invariants()
    s.abort("b")
    assert kv.ref_count(1) == kv.ref_count(2) == 1 and 1 not in kv.free_pages() and 2 not in kv.free_pages()
    kv.check_invariants()
    s.abort("c")
    assert kv.ref_count(1) == kv.ref_count(2) == 0 and kv.evictable_pages()[-2:] == [2, 1]
    kv.check_invariants()


def _cache(kv, rid, tokens):
    """Allocate and register pages for tokens (as if computed), return the page table."""
    assert kv.allocate(rid, len(tokens)) is not None
    kv.cache_pages(rid, [], lambda a, b: tokens[a:b], len(tokens) // kv.page_size)
    return kv.page_table(rid)


def test_eviction_lru_leaves_first_and_unhashed_pages_go_first():
    kv = KVCacheManager(9, 2, enable_prefix_caching=True)   # 8 usable pages
    ta, tb = list(range(10, 16)), list(range(20, 24))
    assert _cache(kv, "a", ta) == [1, 2, 3]
    assert _cache(kv, "b", tb) == [4, 5]
    assert kv.allocate("x", 5) == [6, 7, 8]                 # unhashed
    kv.free("a")
    kv.free("x")
    kv.free("b")
    # unhashed free queue first (x's pages, tail first), then cached pages least recently freed first,
    # each request's leaves before its parents
    assert kv.free_pages() == [8, 7, 6, 3, 2, 1, 5, 4]
    assert kv.evictable_pages() == [3, 2, 1, 5, 4]
    assert kv.allocate("y", 8) == [8, 7, 6, 3]              # unhashed first, then evict a's leaf
    assert kv.page_hash(3) is None and kv.num_evictions == 1
    # a's first two pages are still a hit; its third is gone
    hs = []
    assert kv.lookup(hs, lambda a, b: ta[a:b], 3) == [1, 2]
    assert kv.lookup([], lambda a, b: tb[a:b], 2) == [4, 5]
    # touching b's pages (a hit) removes them from the LRU queue; then the next eviction takes a's pages
    assert kv.allocate("b2", 5, cached_pages=[4, 5]) == [4, 5, 2]
    assert kv.evictable_pages() == [1] and kv.ref_count(4) == 1 and kv.page_hash(2) is None
    kv.check_invariants()
    kv.free("b2")
    assert kv.evictable_pages() == [1, 5, 4]                # re-freed: most recently used at the back
    kv.check_invariants()


def test_in_use_cached_pages_are_never_evicted():
    kv = KVCacheManager(5, 2, enable_prefix_caching=True)   # 4 usable pages
    t = list(range(10, 16))
    assert _cache(kv, "a", t) == [1, 2, 3]                 # all cached, all in use
    assert kv.allocate("b", 4) is None                     # 1 free page, 2 needed: no eviction of a's pages
    assert kv.allocate("b", 2) == [4]
    assert kv.allocate("c", 2) is None
    kv.check_invariants()
    # a hit on pages in use needs no free pages for them
    assert kv.allocate("d", 4, cached_pages=[1, 2]) == [1, 2]
    assert kv.ref_count(1) == 2
    # an all-or-nothing failure with cached pages changes nothing
    kv.free("a")
    before = (kv.free_pages(), kv.owners(), [kv.ref_count(p) for p in range(5)])
    assert kv.allocate("e", 8, cached_pages=[3]) is None   # 3 is evictable; needs 3 more, 0 left besides it
    assert (kv.free_pages(), kv.owners(), [kv.ref_count(p) for p in range(5)]) == before
    kv.check_invariants()


def test_preempted_request_rehits_its_own_pages():
    # 6 usable pages of 4 tokens; two requests that together outgrow the cache
    kv, s = make(num_pages=7, page_size=4, budget=64, mml=24)
    s.add_request(req("a", BASE[:8], max_tokens=12))
    s.add_request(req("b", BASE[20:28], max_tokens=12))
    seen_preempt = False
    for _ in range(100):
        if not s.has_unfinished():
            break
        before = s.stats().prefix_cache_hits
        out, _ = step(s)
        for q in out.scheduled:
            r = s.get(q.request_id)
            if r is not None:
                assert q.token_ids == r.all_token_ids[q.start_pos:q.start_pos + q.num_tokens]
        if out.preempted_ids:
            seen_preempt = True
        kv.check_invariants()
        if seen_preempt and s.stats().prefix_cache_hits > before:
            # re-admitted with a hit: it starts after the cached pages, at a page boundary
            q = out.scheduled[-1]
            assert q.start_pos % 4 == 0 and q.start_pos > 0
    assert seen_preempt and not s.has_unfinished()
    assert s.stats().prefix_cache_hit_requests >= 1
    assert kv.num_free_pages == kv.num_usable_pages


# ---- property test: simulated device KV ------------------------------------------------------------------------
class KVSim:
    """The device's KV cache, as the token prefix each slot's KV was computed from."""

    def __init__(self, kv: KVCacheManager):
        self.kv = kv
        self.slots: dict[tuple[int, int], tuple] = {}

    def execute(self, s: Scheduler, out, prev_sampled: dict[str, int]):
        ps = self.kv.page_size
        for q in out.scheduled:
            r = s.get(q.request_id)
            ids = list(q.token_ids)
            if q.num_placeholders:
                ids[-1] = prev_sampled[q.request_id]
            # everything attended to must be the KV of exactly this sequence's prefix
            context = r.token_slice(0, q.start_pos)
            assert len(context) == q.start_pos
            for p in range(q.start_pos):
                assert self.slots.get((q.page_table[p // ps], p % ps)) == tuple(context[:p + 1]), (
                    f"{q.request_id}: wrong KV at position {p}")
            full = context + ids
            for p in range(q.start_pos, q.start_pos + len(ids)):
                page = q.page_table[p // ps]
                assert self.kv.ref_count(page) == 1, f"write into shared page {page}"
                assert self.kv.page_hash(page) is None, f"write into cached page {page}"
                self.slots[(page, p % ps)] = tuple(full[:p + 1])


def _random_prompt(rng, bases, mml):
    plen = rng.randint(1, max(1, mml // 2))
    if rng.random() < 0.8:
        base = rng.choice(bases)
        k = rng.randint(0, plen)
        return base[:k] + [rng.randrange(VOCAB) for _ in range(plen - k)]
    return [rng.randrange(VOCAB) for _ in range(plen)]


def _run_random(rng, ops, page_size, num_pages, mml, budget, max_num_seqs, pipelined):
    kv = KVCacheManager(num_pages, page_size, enable_prefix_caching=True)
    s = Scheduler(kv, budget, max_num_seqs, mml, eos_token_ids={EOS})
    sim = KVSim(kv)
    bases = [[rng.randrange(VOCAB) for _ in range(mml)] for _ in range(3)]
    accepted, finished = {}, set()
    in_flight = None          # (out, sampled) whose update() is pending
    last_sampled: dict[str, int] = {}
    counter = 0

    def do_update(out, sampled):
        for r in s.update(out, sampled):
            finished.add(r.request_id)

    def one_step():
        nonlocal in_flight
        out = s.schedule()
        # device: runs after the step in flight (whose samples fill the placeholders)
        sim.execute(s, out, last_sampled)
        sampled = {q.request_id: rng.randrange(VOCAB) for q in out.scheduled if q.sample}
        last_sampled.update(sampled)
        owned_by = {}
        for rid, pages in kv.owners().items():
            for p in pages:
                owned_by.setdefault(p, []).append(rid)
        for p, rids in owned_by.items():
            assert len(rids) == 1 or kv.page_hash(p) is not None, "double ownership of an uncached page"
        if pipelined:
            if in_flight is not None:
                do_update(*in_flight)
            in_flight = (out, {k: [v] for k, v in sampled.items()}) if out.scheduled else None
        else:
            do_update(out, {k: [v] for k, v in sampled.items()})
        kv.check_invariants()

    for op in ops:
        if op == "add":
            rid = f"r{counter}"
            counter += 1
            prompt = _random_prompt(rng, bases, mml)
            mt = rng.randint(1, max(1, mml - len(prompt)))
            r = Request(rid, prompt, SP(mt, [STOP_ID] if rng.random() < 0.3 else None, rng.random() < 0.5))
            r.use_prefix_cache = rng.random() < 0.9
            s.add_request(r)
            accepted[rid] = r
        elif op == "step":
            one_step()
        elif counter:
            rid = f"r{rng.randrange(counter)}"
            r = s.abort(rid) if op == "abort" else s.finish(rid, "stop", "STOP")
            if r is not None:
                finished.add(rid)
            kv.check_invariants()
    for _ in range(3000):
        if not s.has_unfinished() and in_flight is None:
            break
        one_step()
    assert not s.has_unfinished() and in_flight is None
    assert finished == set(accepted)
    assert kv.num_free_pages == kv.num_usable_pages and kv.owners() == {}
    assert all(kv.ref_count(p) == 0 for p in range(kv.num_pages))
    kv.check_invariants()
    return s


OPS = ["add", "add", "step", "step", "step", "abort", "finish"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), pipelined=st.booleans())
def test_random_operations_with_shared_prefixes(data, pipelined):
    rng = random.Random(data.draw(st.integers(0, 2**32 - 1), label="seed"))
    page_size = data.draw(st.integers(1, 4), label="page_size")
    num_pages = data.draw(st.integers(3, 14), label="num_pages")
    capacity = (num_pages - 1) * page_size
    mml = data.draw(st.integers(max(2, capacity // 2), capacity), label="max_model_len")
    ops = data.draw(st.lists(st.sampled_from(OPS), min_size=5, max_size=50), label="ops")
    _run_random(rng, ops, page_size, num_pages, mml, data.draw(st.integers(1, 12), label="budget"),
                data.draw(st.integers(1, 4), label="max_num_seqs"), pipelined)


def test_seeded_stress_hits_evicts_and_preempts():
    hits = evictions = preemptions = 0
    for seed in range(40):
        for pipelined in (False, True):
            rng = random.Random(seed)
            page_size = rng.randint(1, 4)
            num_pages = rng.randint(4, 14)
            capacity = (num_pages - 1) * page_size
            mml = rng.randint(max(2, capacity // 2), capacity)
            ops = [rng.choice(OPS) for _ in range(120)]
            s = _run_random(rng, ops, page_size, num_pages, mml, rng.randint(1, 12), rng.randint(2, 5), pipelined)
            st_ = s.stats()
            hits += st_.prefix_cache_hit_requests
            preemptions += st_.num_preemptions_total
            evictions += s.kv.num_evictions
    assert hits >= 100 and evictions >= 100 and preemptions >= 50, (hits, evictions, preemptions)


def test_reset_prefix_cache():
    kv = KVCacheManager(9, 2, enable_prefix_caching=True)
    _cache(kv, "a", list(range(10, 16)))
    kv.free("a")
    kv.reset_prefix_cache()
    assert kv.num_cached_pages == 0 and kv.evictable_pages() == [] and kv.num_free_pages == 8
    kv.check_invariants()


# ---- engine level --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llms(tiny_llama_dir):
    import jaxinfer

    kw = dict(num_pages=120, max_model_len=512, max_num_batched_tokens=64, max_num_seqs=8, progress=False,
              warmup=False)
    return {on: jaxinfer.LLM(tiny_llama_dir, enable_prefix_caching=on, **kw) for on in (True, False)}


def _shared_prefix_workload(seed=0, n=16):
    import numpy as np

    rng = np.random.default_rng(seed)
    bases = [rng.integers(3, 512, size=200).tolist() for _ in range(2)]
    prompts = []
    for i in range(n):
        base = bases[i % 2]
        k = int(rng.integers(20, 200))
        prompts.append(base[:k] + rng.integers(3, 512, size=int(rng.integers(0, 30))).tolist())
    return prompts


def _run_engine(engine, prompts, params, rng):
    pending = list(range(len(prompts)))
    done = {}
    while pending or engine.has_unfinished():
        for _ in range(int(rng.integers(0, 3))):
            if pending:
                i = pending.pop(0)
                engine.add_request(f"p{i}", prompts[i], params[i])
        for out in engine.step():
            if out.finished:
                done[int(out.request_id[1:])] = out
    return [done[i] for i in range(len(prompts))]


def test_engine_outputs_identical_with_and_without_prefix_caching(llms):
    import numpy as np

    from jaxinfer import SamplingParams

    prompts = _shared_prefix_workload()
    params = [SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True) if i % 2 else
              SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=100 + i, ignore_eos=True)
              for i in range(len(prompts))]
    got = {}
    for on, llm in llms.items():
        # run twice: the second pass hits pages cached by the first (and by its own interleaved requests)
        got[on] = [_run_engine(llm.engine, prompts, params, np.random.default_rng(r)) for r in (1, 2)]
        assert llm.engine.kv.num_used_pages == 0
    want = [o.outputs[0].token_ids for o in got[False][0]]
    for on in (True, False):
        for outs in got[on]:
            assert [o.outputs[0].token_ids for o in outs] == want
    on_stats = llms[True].engine.prefix_cache_stats()
    assert on_stats["enabled"] and on_stats["hits"] > 0 and on_stats["hit_requests"] > 0
    assert on_stats["queries"] >= sum(len(p) for p in prompts)
    off_stats = llms[False].engine.prefix_cache_stats()
    assert not off_stats["enabled"] and off_stats["hits"] == 0


def test_prompt_logprobs_bypass_the_cache(llms):
    from jaxinfer import SamplingParams

    prompt = _shared_prefix_workload(seed=3, n=1)[0][:150] + [7, 8, 9]
    sp = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    lp = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True, prompt_logprobs=2)
    res = {}
    for on, llm in llms.items():
        llm.generate([prompt], sp, use_tqdm=False)             # caches the prompt's pages (when on)
        before = llm.engine.prefix_cache_stats()["hits"]
        out = llm.generate([prompt], lp, use_tqdm=False)[0]
        assert llm.engine.prefix_cache_stats()["hits"] == before  # the prompt_logprobs request did not hit
        assert len(out.prompt_logprobs) == len(prompt) and out.prompt_logprobs[0] is None
        assert all(d is not None and prompt[j] in d for j, d in enumerate(out.prompt_logprobs) if j)
        res[on] = out
        # a plain request after it still hits
        llm.generate([prompt], sp, use_tqdm=False)
        if on:
            assert llm.engine.prefix_cache_stats()["hits"] > before
    a, b = res[True], res[False]
    assert a.outputs[0].token_ids == b.outputs[0].token_ids
    for da, db in zip(a.prompt_logprobs[1:], b.prompt_logprobs[1:]):
        assert da.keys() == db.keys()
        for t in da:
            assert da[t].logprob == pytest.approx(db[t].logprob, abs=1e-4)


def test_engine_preemption_and_abort_with_prefix_caching(tiny_llama_dir, llms):
    """A cache too small for the batch (preemptions: re-admitted requests re-hit pages) plus aborts mid-run
    (pages of aborted requests in flight are never registered): the surviving requests give the cache-off,
    unpressured engine's greedy tokens, and every page comes back."""
    import jaxinfer
    from jaxinfer import SamplingParams

    prompts = _shared_prefix_workload(seed=5, n=12)
    sp = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in llms[False].generate(prompts, sp, use_tqdm=False)]
    aborted = {3: 4, 7: 9}  # request index -> engine step at which it is aborted
    for on in (True,):
        llm = jaxinfer.LLM(tiny_llama_dir, enable_prefix_caching=on, num_pages=40, max_model_len=512,
                           max_num_batched_tokens=64, max_num_seqs=8, progress=False, warmup=False)
        eng = llm.engine
        for i, p in enumerate(prompts):
            eng.add_request(f"p{i}", p, sp)
        done, step = {}, 0
        while eng.has_unfinished():
            for i, at in aborted.items():
                if step == at:
                    assert eng.abort(f"p{i}")
            for out in eng.step():
                if out.finished:
                    done[int(out.request_id[1:])] = out.outputs[0].token_ids
            step += 1
        assert sorted(done) == [i for i in range(len(prompts)) if i not in aborted]
        assert {i: done[i] for i in done} == {i: want[i] for i in done}
        st = eng.scheduler.stats()
        assert st.num_preemptions_total > 0 and eng.kv.num_used_pages == 0
        assert eng.prefix_cache_stats()["hits"] > 0


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_manager_page_hash_equals_hash_page(page_size):
    """KVCacheManager._hash_page (struct-packed ids, a copied blake2b state; cache_pages_each hashes through it) gives
    hash_page's bytes: full pages of small, large and negative ids, and a short slice (hash_page itself)."""
    rng = random.Random(page_size)
    kv = KVCacheManager(8, page_size, enable_prefix_caching=True)
    parent = root_hash("bf16")
    for _ in range(50):
        ids = [rng.choice((rng.randrange(0, 300), rng.randrange(-2**63, 2**63))) for _ in range(page_size)]
        assert kv._hash_page(parent, ids) == hash_page(parent, ids)
        parent = kv._hash_page(parent, ids)
    assert kv._hash_page(parent, [5] * (page_size + 1)) == hash_page(parent, [5] * (page_size + 1))
    # through cache_pages_each: the registered hashes are the hash_page chain
    kv.allocate("a", 3 * page_size)
    toks = [rng.randrange(0, 1000) for _ in range(3 * page_size)]
    hashes = []
    for n in (1, 2, 3):
        kv.cache_pages_each([("a", hashes, lambda a, b: toks[a:b], n)])
    want, p = [], root_hash(None)
    for i in range(3):
        p = hash_page(p, toks[i * page_size:(i + 1) * page_size])
        want.append(p)
    assert hashes == want and [kv.page_hash(q) for q in kv.page_lists["a"]] == want
