"""Speculative decoding on the host: n-gram proposals against brute force, the scheduler's k+1-token chunks,
rollback and page release after rejections (exact page accounting, prefix-cache hashes only over accepted
tokens, under preemption and aborts), adaptive k. Pure host code, milliseconds per test."""

import random
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxinfer.engine.kv_cache import KVCacheManager, hash_page, root_hash
from jaxinfer.engine.ngram_proposer import ngram_propose
from jaxinfer.engine.request import Request
from jaxinfer.engine.scheduler import Scheduler
from jaxinfer.engine.spec_control import SpecControl

EOS = 2


@dataclass
class SP:
    max_tokens: int | None = 32
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = True
    min_tokens: int = 0
    logprobs: int | None = None
    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    uses_penalties: bool = False


# ---- n-gram proposer ------------------------------------------------------------------------------
def _ngram_brute(tokens, k, min_n, max_n):
    """Reference: for n = max_n .. min_n, the latest i < N - n with tokens[i:i+n] == tail -> tokens[i+n:i+n+k]."""
    N = len(tokens)
    for n in range(min(max_n, N - 1), min_n - 1, -1):
        tail = tokens[N - n:]
        for i in range(N - n - 1, -1, -1):
            if tokens[i:i + n] == tail:
                return tokens[i + n:i + n + k]
    return []


@settings(max_examples=300, deadline=None)
@given(tokens=st.lists(st.integers(0, 4), min_size=1, max_size=40), k=st.integers(1, 5),
       min_n=st.integers(1, 3), extra=st.integers(0, 2))
def test_ngram_matches_brute_force(tokens, k, min_n, extra):
    assert ngram_propose(tokens, k, min_n, min_n + extra) == _ngram_brute(tokens, k, min_n, min_n + extra)


def test_ngram_quotes_the_prompt():
    prompt = [10, 11, 12, 13, 14, 15, 16, 17]
    assert ngram_propose(prompt + [20, 12, 13], 3) == [14, 15, 16]
    assert ngram_propose([1, 2, 3, 4], 3) == []


# ---- scheduler chunks -----------------------------------------------------------------------------
def make(num_pages=64, page_size=4, budget=64, max_seqs=8, max_model_len=256, prefix=False):
    kv = KVCacheManager(num_pages, page_size, enable_prefix_caching=prefix)
    return Scheduler(kv, budget, max_seqs, max_model_len, {EOS})


def test_spec_chunk_is_last_token_plus_drafts_then_rolls_back():
    s = make(page_size=4)
    r = Request("a", [100, 101, 102, 103, 104, 105], SP())
    s.add_request(r)
    out = s.schedule()
    s.update(out, {"a": [7]})                      # prefill: 7 tokens known, 6 computed
    r.spec_token_ids = [8, 9, 10, 11]
    out = s.schedule()
    (q,) = out.scheduled
    assert (q.token_ids, q.start_pos, q.num_spec_tokens, q.sample) == ([7, 8, 9, 10, 11], 6, 4, True)
    assert len(q.page_table) == 3 and r.num_computed_tokens == 11  # positions 6..10 need pages 1..3
    s.update(out, {"a": [8, 9, 50]})               # 2 drafts accepted, then the target's own token
    assert r.output_token_ids == [7, 8, 9, 50]
    assert r.num_computed_tokens == 9 and r.num_tokens == 10   # decode-ready again
    assert s.kv.num_pages_of("a") == 3              # 9 tokens -> 3 pages (the page of rejected 10, 11 kept: 9..11)
    r.spec_token_ids = [1, 2, 3, 4]
    out = s.schedule()
    s.update(out, {"a": [60]})                      # all rejected
    assert r.num_computed_tokens == 10 and s.kv.num_pages_of("a") == 3
    s.kv.check_invariants()


def test_rejected_page_is_released():
    s = make(page_size=4)
    r = Request("a", [100, 101, 102], SP())
    s.add_request(r)
    s.update(s.schedule(), {"a": [7]})              # 4 tokens, 3 computed, 1 page
    r.spec_token_ids = [1, 2, 3, 4, 5, 6]
    out = s.schedule()
    assert s.kv.num_pages_of("a") == 3              # positions 3..9
    free_before = s.kv.num_free_pages
    s.update(out, {"a": [9]})
    assert r.num_computed_tokens == 4 and s.kv.num_pages_of("a") == 1
    assert s.kv.num_free_pages == free_before + 2
    s.kv.check_invariants()


def test_drafts_trimmed_to_max_tokens_model_len_and_budget():
    s = make(max_model_len=12, budget=64)
    r = Request("a", list(range(100, 108)), SP(max_tokens=3))
    s.add_request(r)
    s.update(s.schedule(), {"a": [7]})
    r.spec_token_ids = [1, 2, 3, 4]
    (q,) = s.schedule().scheduled
    assert q.num_spec_tokens == 1                   # outputs: 1 known + 1 draft + 1 bonus = max_tokens 3
    s2 = make(max_model_len=10)
    r2 = Request("b", list(range(100, 108)), SP(max_tokens=None))
    s2.add_request(r2)
    s2.update(s2.schedule(), {"b": [7]})            # 9 tokens; positions 8.. may reach 9 only
    r2.spec_token_ids = [1, 2, 3]
    (q2,) = s2.schedule().scheduled
    assert q2.num_spec_tokens == 1 and q2.start_pos + q2.num_tokens <= 10
    s3 = make(budget=3)
    r3 = Request("c", [100, 101], SP())
    s3.add_request(r3)
    s3.update(s3.schedule(), {"c": [7]})
    r3.spec_token_ids = [1, 2, 3, 4]
    (q3,) = s3.schedule().scheduled
    assert q3.num_tokens == 3 and q3.num_spec_tokens == 2


def test_drafts_are_dropped_if_not_used_this_step():
    s = make()
    r = Request("a", [100, 101], SP())
    s.add_request(r)
    r.spec_token_ids = [1, 2]                        # not decode-ready (prefill pending): ignored
    (q,) = s.schedule().scheduled
    assert q.num_spec_tokens == 0 and r.spec_token_ids == []


# ---- random operations: rollback keeps page accounting and prefix-cache hashes exact -----------------
def _check_hashes(s: Scheduler, reqs: dict):
    """Every page carrying a hash holds the KV of the chain it names: recompute the chain from the owner's
    real tokens (drafts never enter a request's tokens; a hash over a rejected draft would not match)."""
    kv = s.kv
    for rid, pages in kv.owners().items():
        r = reqs[rid]
        toks = r.all_token_ids
        parent = root_hash(kv.extra_key)
        for i, p in enumerate(pages):
            if (i + 1) * kv.page_size > len(toks):
                break
            parent = hash_page(parent, toks[i * kv.page_size:(i + 1) * kv.page_size])
            h = kv.page_hash(p)
            assert h is None or h == parent, f"page {p} of {rid} carries a hash of other tokens"
            if h is not None:
                assert (i + 1) * kv.page_size <= r.num_computed_tokens, "hashed page beyond the computed KV"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), prefix=st.booleans())
def test_random_speculation_keeps_pages_exact(seed, prefix):
    rng = random.Random(seed)
    s = make(num_pages=14, page_size=4, budget=24, max_seqs=4, max_model_len=48, prefix=prefix)
    reqs: dict[str, Request] = {}
    n = 0
    for _ in range(60):
        op = rng.random()
        if op < 0.25:
            rid = f"r{n}"
            n += 1
            base = rng.choice([[3, 4, 5, 6, 7, 8, 9, 10], [11, 12, 13]])  # shared prefixes -> cache hits
            r = Request(rid, base[:rng.randint(1, len(base))] + [rng.randrange(20) for _ in range(rng.randint(0, 6))],
                        SP(max_tokens=rng.randint(1, 20)))
            s.add_request(r)
            reqs[rid] = r
        elif op < 0.32 and s.running:
            s.abort(rng.choice(s.running).request_id)
        else:
            for r in s.running:  # propose drafts for decode-ready requests (a random 'proposer')
                if r.num_computed_tokens == r.num_tokens - 1 and rng.random() < 0.7:
                    r.spec_token_ids = [rng.randrange(20) for _ in range(rng.randint(1, 5))]
            out = s.schedule()
            for q in out.scheduled:
                r = reqs[q.request_id]
                assert q.token_ids[:len(q.token_ids) - q.num_spec_tokens] == r.token_slice(
                    q.start_pos, q.start_pos + q.num_tokens - q.num_spec_tokens)
                assert q.start_pos + q.num_tokens <= s.max_model_len
                assert len(q.page_table) * 4 >= q.start_pos + q.num_tokens
            sampled = {}
            for q in out.scheduled:
                if q.sample:  # accept a random prefix of the drafts, then a token of the 'target'
                    m = rng.randint(0, q.num_spec_tokens)
                    sampled[q.request_id] = q.token_ids[len(q.token_ids) - q.num_spec_tokens:][:m] + [
                        rng.randrange(20)]
            s.update(out, sampled)
            for r in s.running:
                assert r.num_computed_tokens <= r.num_tokens
                assert s.kv.num_pages_of(r.request_id) <= s.kv.pages_needed(max(r.num_computed_tokens, 1))
        s.kv.check_invariants()
        _check_hashes(s, reqs)
    while s.has_unfinished():
        out = s.schedule()
        s.update(out, {q.request_id: [1] for q in out.scheduled if q.sample})
    s.kv.check_invariants()
    assert s.kv.num_used_pages == 0


# ---- control --------------------------------------------------------------------------------------
class _FixedProposer:
    def __init__(self):
        self.rolled = []

    def propose(self, seqs):
        return {rid: [1] * k for rid, _, k in seqs}

    def rollback(self, rid, n):
        self.rolled.append((rid, n))

    def free(self, rid):
        pass


def test_adaptive_k_and_batch_threshold():
    c = SpecControl(_FixedProposer(), num_speculative_tokens=4, max_batch_size=2, adaptive=True)
    ks = []
    for _ in range(6):
        c.record("a", 4, 0, 10)            # nothing accepted: k shrinks to 1 and stays there
        ks.append(c._req["a"].k)
    assert ks[-1] == 1 and ks == sorted(ks, reverse=True)
    for _ in range(10):
        c.record("a", c._req["a"].k, c._req["a"].k, 10)  # everything accepted: k grows back to 4
    assert c._req["a"].k == 4
    assert c.active(2) and not c.active(3) and c.stats.num_skipped_batch == 1
    m = c.request_metrics(["a"])
    assert m["spec_verify_steps"] == 16 and 0 < m["spec_acceptance_rate"] < 1
    assert SpecControl.eligible(SP(temperature=0.7)) and not SpecControl.eligible(SP(temperature=0.7, top_p=0.9))
    assert not SpecControl.eligible(SP(logprobs=1))


def test_speculative_config_errors_name_the_value():
    import pytest

    from jaxinfer.config import ConfigError, EngineConfig, SpeculativeConfig

    assert EngineConfig.from_options(speculative_config={"method": "ngram"}).speculative == SpeculativeConfig("ngram")
    for bad, words in (({"method": "medusa"}, "'medusa'"), ({"methd": "ngram"}, "'methd'"),
                       ({"num_speculative_tokens": 0}, "num_speculative_tokens=0"),
                       ({"method": "draft"}, "draft_model=PATH"), ({"max_batch_size": 0}, "max_batch_size=0"),
                       ({"method": "layer_skip", "draft_quantization": "int8"}, "only used by method 'draft'"),
                       ({"method": "draft", "draft_model": "m", "draft_quantization": "int3"}, "'int3'")):
        with pytest.raises(ConfigError, match=words):
            EngineConfig.from_options(speculative_config=bad)


def test_penalised_requests_do_not_speculate():
    """Verification scores drafts with the unpenalised distribution, so penalised requests must decode normally."""
    from jaxinfer.engine.spec_control import SpecControl
    from jaxinfer.sampling_params import SamplingParams

    assert SpecControl.eligible(SamplingParams(temperature=0.0))
    for kw in (dict(presence_penalty=0.5), dict(frequency_penalty=-0.3), dict(repetition_penalty=1.2)):
        assert not SpecControl.eligible(SamplingParams(temperature=0.0, **kw)), kw
