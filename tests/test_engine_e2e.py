"""The paged engine end to end on CPU: continuous batching equals solo decoding, preemption, compile counts,
seeded sampling, errors that leave the engine serving."""
import numpy as np
import pytest
import jax

import jaxinfer
from jaxinfer import SamplingParams

GREEDY = dict(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    # warmup=True: test_no_compilation_after_warmup checks that it compiled everything (the suite defaults to lazy)
    return jaxinfer.LLM(tiny_llama_dir, num_pages=200, max_model_len=512, max_num_batched_tokens=128,
                        max_num_seqs=16, progress=False, warmup=True)


def _workload(seed=0, n=32):
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(3, 512, size=int(rng.integers(1, 301))).tolist() for _ in range(n)]
    max_tokens = [int(rng.integers(1, 24)) for _ in range(n)]
    return prompts, max_tokens


def _solo(llm, prompts, max_tokens):
    return [llm.generate([p], SamplingParams(max_tokens=m, **GREEDY), use_tqdm=False)[0].outputs[0].token_ids
            for p, m in zip(prompts, max_tokens)]


def _staggered(engine, prompts, max_tokens, rng):
    """Add requests at random steps while the engine runs; returns {index: token_ids}."""
    pending = list(range(len(prompts)))
    done = {}
    while pending or engine.has_unfinished():
        for _ in range(int(rng.integers(0, 4))):
            if pending:
                i = pending.pop(0)
                engine.add_request(f"r{i}", prompts[i], SamplingParams(max_tokens=max_tokens[i], **GREEDY))
        for out in engine.step():
            if out.finished:
                done[int(out.request_id[1:])] = out.outputs[0].token_ids
    return done


def test_continuous_batching_equals_solo(llm):
    prompts, max_tokens = _workload()
    solo = _solo(llm, prompts, max_tokens)
    done = _staggered(llm.engine, prompts, max_tokens, np.random.default_rng(1))
    assert [done[i] for i in range(len(prompts))] == solo
    assert all(len(s) == m for s, m in zip(solo, max_tokens))
    assert llm.engine.kv.num_used_pages == 0


def test_early_host_copy_gives_the_same_outputs(llm, monkeypatch):
    """ModelRunner.early_host_copy (the results' device->host copy started at dispatch; the default) against the
    copy started in fetch."""
    prompts, max_tokens = _workload(seed=3, n=12)
    monkeypatch.setattr(llm.runner, "early_host_copy", False)
    off = llm.generate(prompts, [SamplingParams(max_tokens=m, **GREEDY) for m in max_tokens], use_tqdm=False)
    monkeypatch.setattr(llm.runner, "early_host_copy", True)
    on = llm.generate(prompts, [SamplingParams(max_tokens=m, **GREEDY) for m in max_tokens], use_tqdm=False)
    assert [o.outputs[0].token_ids for o in on] == [o.outputs[0].token_ids for o in off]
    assert all(len(o.outputs[0].token_ids) == m for o, m in zip(on, max_tokens))


def test_preemption_keeps_outputs(tiny_llama_dir, llm):
    prompts, max_tokens = _workload(seed=2, n=30)
    solo = _solo(llm, prompts, max_tokens)
    # 40 pages of 16 tokens: the longest request (~320 tokens) fits, a handful at once do not.
    small = jaxinfer.LLM(tiny_llama_dir, num_pages=41, max_model_len=512, max_num_batched_tokens=128,
                         max_num_seqs=16, progress=False)
    done = _staggered(small.engine, prompts, max_tokens, np.random.default_rng(3))
    assert small.engine.scheduler.stats().num_preemptions_total > 0
    assert [done[i] for i in range(len(prompts))] == solo
    assert small.engine.kv.num_used_pages == 0


def test_no_compilation_after_warmup(llm):
    events = []

    def listener(name, *args, **kwargs):
        if "compile" in name or "trace" in name:
            events.append(name)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        jax.jit(lambda x: x * 3 + 1)(np.arange(7.0))  # the listener sees a fresh compile...
        assert any("backend_compile" in e for e in events)
        events.clear()  # ...and from here on must see none
        prompts, max_tokens = _workload(seed=4, n=40)
        rng = np.random.default_rng(5)
        eng = llm.engine
        steps = 0
        for i, (p, m) in enumerate(zip(prompts, max_tokens)):
            eng.add_request(f"c{i}", p, SamplingParams(max_tokens=m, temperature=float(rng.choice([0, 0.8])),
                                                       top_k=int(rng.choice([-1, 5, 40])),
                                                       top_p=float(rng.choice([1.0, 0.9])),
                                                       logprobs=int(rng.choice([0, 5])) if i % 3 else None,
                                                       seed=i, frequency_penalty=0.5 if i % 4 == 1 else 0.0,
                                                       repetition_penalty=1.2 if i % 5 == 2 else 1.0))
        while eng.has_unfinished() and steps < 200:
            eng.step()
            steps += 1
        while eng.has_unfinished():
            eng.step()
            steps += 1
        assert steps >= 50
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert events == [], f"compiled or traced after warm-up: {events[:5]}"


def test_seeded_sampling_independent_of_batch(llm):
    sp = SamplingParams(temperature=1.0, top_p=0.95, seed=1234, max_tokens=16, ignore_eos=True)
    prompt = list(range(10, 40))
    alone = llm.generate([prompt], sp, use_tqdm=False)[0].outputs[0].token_ids
    again = llm.generate([prompt], sp, use_tqdm=False)[0].outputs[0].token_ids
    others = [list(range(50, 50 + k)) for k in (3, 70, 130)]
    mixed = llm.generate(others[:2] + [prompt] + others[2:],
                         [SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True)] * 2 + [sp] +
                         [SamplingParams(temperature=0.7, max_tokens=5)], use_tqdm=False)
    assert alone == again == mixed[2].outputs[0].token_ids
    other_seed = llm.generate([prompt], sp.clone(seed=99), use_tqdm=False)[0].outputs[0].token_ids
    assert other_seed != alone


def test_bad_requests_leave_engine_serving(llm):
    eng = llm.engine
    eng.add_request("good", list(range(5, 25)), SamplingParams(max_tokens=8, **GREEDY))
    with pytest.raises(ValueError, match="max_model_len"):
        eng.add_request("too-long", list(range(3, 503)), SamplingParams(max_tokens=100))
    with pytest.raises(ValueError, match="vocabulary"):
        eng.add_request("bad-token", [5, 99999], SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match="empty"):
        eng.add_request("empty", [], SamplingParams(max_tokens=4))
    outs = []
    while eng.has_unfinished():
        outs += [o for o in eng.step() if o.finished]
    assert [o.request_id for o in outs] == ["good"] and len(outs[0].outputs[0].token_ids) == 8


def test_abort_frees_pages(llm):
    eng = llm.engine
    eng.add_request("a", list(range(5, 105)), SamplingParams(max_tokens=50, **GREEDY))
    eng.add_request("b", list(range(5, 45)), SamplingParams(max_tokens=5, **GREEDY))
    for _ in range(3):
        eng.step()
    assert eng.kv.num_used_pages > 0
    assert eng.abort("a")
    while eng.has_unfinished():
        eng.step()
    assert eng.kv.num_used_pages == 0 and not eng.abort("a")


def test_n_samples_and_logprobs(llm):
    out = llm.generate([list(range(5, 30))], SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=6,
                                                            logprobs=3, ignore_eos=True), use_tqdm=False)[0]
    assert len(out.outputs) == 3 and len({tuple(c.token_ids) for c in out.outputs}) > 1
    for c in out.outputs:
        assert len(c.logprobs) == 6
        for tok, d in zip(c.token_ids, c.logprobs):
            assert tok in d and len(d) >= 3
            ranked = sorted((lp.rank, lp.logprob) for lp in d.values() if lp.rank is not None and lp.rank <= 3)
            assert [r for r, _ in ranked] == [1, 2, 3]
            assert ranked[0][1] >= ranked[1][1] >= ranked[2][1]
        assert c.cumulative_logprob == pytest.approx(sum(d[t].logprob for t, d in zip(c.token_ids, c.logprobs)),
                                                     abs=1e-4)


@pytest.mark.parametrize("split_causal", ["0", "1"])
def test_pallas_attention_backend_matches_reference(tiny_llama_dir, llm, split_causal, monkeypatch):
    """The engine with the Pallas kernel (interpret mode on CPU) gives the reference backend's greedy tokens, also
    with the kernel's unmasked loop below each tile's diagonal (JAXINFER_SPLIT_CAUSAL=1, read while tracing)."""
    monkeypatch.setenv("JAXINFER_SPLIT_CAUSAL", split_causal)
    prompts, max_tokens = _workload(seed=9, n=6)
    want = llm.generate(prompts, [SamplingParams(max_tokens=m, **GREEDY) for m in max_tokens], use_tqdm=False)
    pallas = jaxinfer.LLM(tiny_llama_dir, num_pages=200, max_model_len=512, max_num_batched_tokens=128,
                          max_num_seqs=16, attention_backend="pallas", warmup=False, progress=False)
    got = pallas.generate(prompts, [SamplingParams(max_tokens=m, **GREEDY) for m in max_tokens], use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
