"""Pipelined n-gram speculation end to end on CPU (float32): the prompt lookup runs on the device from the step in
flight's carry (runner/ngram_device.py), so verification step n+1 is dispatched before step n's accepted counts are
read. The model is the tiny random Llama with its attention output projections zeroed: the next token then depends
on the current token only, greedy continuations fall into cycles and n-gram drafts are both accepted (inside a
cycle) and rejected (matches in the random prompt). (KV-position correctness of pipelined steps with context-
dependent outputs is covered by tests/test_spec_pipelined.py and tests/test_spec_e2e.py, which also run n-gram
pipelined now.) Checked against plain decoding of the same model: identical greedy outputs with stop tokens, stop
strings, max_tokens, preemption and an abort with a step in flight; every pipelined proposal equal to the host
proposer's on the true tokens; no page or history slot leaked."""
import numpy as np
import pytest

import jaxinfer
from jaxinfer import SamplingParams
from jaxinfer.engine.ngram_proposer import ngram_propose
from jaxinfer.runner.ngram_device import DeviceNgramProposer
from jaxinfer.runner.spec_carry import DRAFT, SHIFT
from tests.spec_cases import greedy, run_staggered, speculates

KW = dict(max_model_len=256, max_num_batched_tokens=32, max_num_seqs=8, progress=False)
K = 3


@pytest.fixture(scope="module")
def bigram_dir(tiny_llama_dir, tmp_path_factory):
    import torch
    import transformers as tf

    model = tf.LlamaForCausalLM.from_pretrained(tiny_llama_dir, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
    path = tmp_path_factory.mktemp("tiny_bigram")
    model.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def base(bigram_dir):
    return jaxinfer.LLM(bigram_dir, num_pages=200, **KW)


@pytest.fixture(scope="module")
def spec_llm(bigram_dir):
    return jaxinfer.LLM(bigram_dir, num_pages=8, speculative_config=dict(method="ngram",
                                                                         num_speculative_tokens=K,
                                                                         batch_policy=False), **KW)


def test_pipelined_ngram_identical_to_plain(base, spec_llm):
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 512, size=int(rng.integers(1, 30))).tolist() for _ in range(9)]
    prompts[2] = prompts[2] * 3  # quoting prompts
    max_tokens = [int(rng.integers(1, 40)) for _ in prompts]
    ref = [o.outputs[0].token_ids for o in base.generate(prompts, [greedy(m) for m in max_tokens], use_tqdm=False)]
    assert [len(r) for r in ref] == max_tokens
    stops = {i: [r[len(r) // 2]] for i, r in enumerate(ref) if i % 3 == 0 and len(r) > 4}
    want = {i: (r[:r.index(stops[i][0]) + 1] if i in stops else r) for i, r in enumerate(ref)}

    eng = spec_llm.engine
    prop = eng.spec.proposer
    assert isinstance(prop, DeviceNgramProposer)
    launched, dispatch, propose_device = [], eng.runner.dispatch, prop.propose_device
    calls = []  # (request id, actual tokens before the drafts, k, device drafts)

    def spy(inputs, prev, *a):
        launched.append((speculates(inputs), prev is not None))
        return dispatch(inputs, prev, *a)

    def spy_propose(flight, todo):
        out = propose_device(flight, todo)
        carry = np.asarray(out.carry)  # (a sync: test only)
        for rid, row, n, k, *_ in todo:
            calls.append((rid, n - int(carry[row, SHIFT]), k, carry[row, DRAFT:DRAFT + k].tolist()))
        return out

    eng.runner.dispatch, prop.propose_device = spy, spy_propose
    seqs = {f"r{i}": p for i, p in enumerate(prompts)}
    try:
        done = run_staggered(eng, prompts, max_tokens, stops, rng, victim_tokens=40, abort_at=6)
    finally:
        eng.runner.dispatch, prop.propose_device = dispatch, propose_device
    assert {i: o.outputs[0].token_ids for i, o in done.items()} == want
    for i, o in done.items():
        assert o.outputs[0].finish_reason == ("stop" if i in stops else "length")
    # every pipelined proposal equals the host proposer's on the true tokens at that point
    checked = 0
    for rid, b, k, drafts in calls:
        if rid not in seqs:
            continue
        full = seqs[rid] + want[int(rid[1:])]
        if b > len(full):
            continue  # past a stop token (the step's extra tokens are dropped)
        host = ngram_propose(full[:b], k, 1, 4)
        assert drafts[:len(host)] == host and all(d == 0 for d in drafts[len(host):]), (rid, b)
        checked += bool(host)
    assert checked > 5
    st = eng.spec_stats()
    assert st["num_verify_steps"] > 0 and 0.1 < st["acceptance_rate"] < 0.95
    assert any(s and p for s, p in launched), "no speculative step was pipelined"
    assert eng.scheduler.stats().num_preemptions_total > 0
    eng.kv.check_invariants()
    assert eng.kv.num_used_pages == 0
    assert not prop._slot and not prop._synced and len(prop._free_slots) == KW["max_num_seqs"]


def test_host_fallback_when_not_pipelined(bigram_dir):
    llm = jaxinfer.LLM(bigram_dir, num_pages=200, speculative_config=dict(
        method="ngram", num_speculative_tokens=K, pipelined=False, batch_policy=False), **KW)
    assert not isinstance(llm.engine.spec.proposer, DeviceNgramProposer)


def test_stop_strings_pipelined(bigram_dir, tiny_tokenizer_dir):
    """Stop strings (taken from the plain run's text, so they match, possibly inside a run of accepted drafts)
    end the pipelined outputs exactly where plain decoding's end; text never includes the stop string."""
    plain = jaxinfer.LLM(bigram_dir, tokenizer=tiny_tokenizer_dir, num_pages=200, **KW)
    spec = jaxinfer.LLM(bigram_dir, tokenizer=tiny_tokenizer_dir, num_pages=200, speculative_config=dict(
        method="ngram", num_speculative_tokens=K, batch_policy=False), **KW)
    rng = np.random.default_rng(2)
    prompts = [rng.integers(3, 512, size=int(rng.integers(2, 20))).tolist() for _ in range(6)]
    sp = lambda stop=None: SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, stop=stop)  # noqa: E731
    # prompts that already hold the model's cycle (its own continuation): drafts are accepted from the start
    prompts = [p + o.outputs[0].token_ids for p, o in zip(prompts, plain.generate(prompts, [sp() for _ in prompts],
                                                                                   use_tqdm=False))]
    texts = [o.outputs[0].text for o in plain.generate(prompts, [sp() for _ in prompts], use_tqdm=False)]
    stops = []
    for t in texts:
        cands = [t[j:j + 2] for j in range(len(t) // 2, len(t) - 1) if "\ufffd" not in t[j:j + 2] and t[j:j + 2].strip()]
        stops.append([cands[0]] if cands else None)
    assert sum(s is not None for s in stops) >= 3
    params = [sp(s) for s in stops]
    ref = plain.generate(prompts, params, use_tqdm=False)
    got = spec.generate(prompts, params, use_tqdm=False)
    for r, g, s in zip(ref, got, stops):
        assert (g.outputs[0].text, g.outputs[0].token_ids, g.outputs[0].finish_reason) == \
               (r.outputs[0].text, r.outputs[0].token_ids, r.outputs[0].finish_reason)
        if s is not None:
            assert r.outputs[0].finish_reason == "stop" and s[0] not in r.outputs[0].text
    st = spec.engine.spec_stats()
    assert st["num_verify_steps"] > 0 and st["num_accepted_tokens"] > 0
    assert spec.engine.kv.num_used_pages == 0
