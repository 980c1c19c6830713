"""Presence / frequency / repetition penalties through the whole engine (pipelined steps, chunked prefill,
preemption, mixed batches), against an independent reference: the transformers model run token by token with
the penalties applied in float64 numpy, and transformers' own RepetitionPenaltyLogitsProcessor."""
import numpy as np
import pytest
import torch
import transformers as tf

import jaxinfer
from jaxinfer import SamplingParams

MAX_TOKENS = 24
CASES = [  # (presence, frequency, repetition); the last one is unpenalised and shares the batch
    (0.0, 1.5, 1.0),
    (1.0, 0.0, 1.0),
    (0.0, 0.0, 1.8),
    (0.7, -0.5, 1.3),
    (-1.0, 0.0, 1.0),
    (0.0, 0.0, 1.0),
]


@pytest.fixture(scope="module")
def hf(tiny_llama_dir):
    return tf.LlamaForCausalLM.from_pretrained(tiny_llama_dir, torch_dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(11)
    # short prompts with repeated tokens (repetition penalty acts on the prompt too) and long ones (chunked)
    return [rng.integers(3, 40, size=int(n)).tolist() for n in (5, 9, 70, 33, 12, 50)]


def reference(hf, prompt, pres, freq, rep, n=MAX_TOKENS):
    ids, out = list(prompt), []
    with torch.no_grad():
        for _ in range(n):
            x = hf(torch.tensor([ids])).logits[0, -1].double().numpy().copy()
            for tok in set(prompt) | set(out):
                x[tok] = x[tok] / rep if x[tok] > 0 else x[tok] * rep
            for tok in set(out):
                x[tok] -= freq * out.count(tok) + pres
            tok = int(np.argmax(x))
            ids.append(tok)
            out.append(tok)
    return out


def _params(pres, freq, rep, **kw):
    return SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True, presence_penalty=pres,
                          frequency_penalty=freq, repetition_penalty=rep, **kw)


def _run(llm, prompts):
    outs = llm.generate(prompts, [_params(*c) for c in CASES], use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):  # max_num_batched_tokens=32: the 33-, 50- and 70-token prompts are chunked
    # the shape of the speculation tests' plain engines (tests/test_spec_*.py `base`): the same step programs, one
    # compile in the suite (JAX's persistent cache)
    return jaxinfer.LLM(tiny_llama_dir, num_pages=200, max_model_len=256, max_num_batched_tokens=32,
                        max_num_seqs=8, warmup=False, progress=False)


@pytest.fixture(scope="module")
def refs(hf, prompts):
    return [reference(hf, p, *c) for p, c in zip(prompts, CASES)]


def test_penalties_match_reference_in_one_pipelined_batch(llm, hf, prompts, refs):
    got = _run(llm, prompts)
    assert got == refs
    # The penalties change the outputs (the test can fail), and the unpenalised batch mate is untouched.
    plain = [reference(hf, p, 0.0, 0.0, 1.0) for p in prompts[:-1]]
    assert all(g != p for g, p in zip(got[:-1], plain))
    # Again on the same engine: freed slots are reused and start clean.
    assert _run(llm, prompts[-1:] + prompts[1:]) == [reference(hf, prompts[-1], *CASES[0])] + refs[1:]


def test_penalties_survive_preemption(tiny_llama_dir, prompts, refs):
    """A tiny cache forces preemptions: recomputed sequences rebuild their counts from their known tokens."""
    llm = jaxinfer.LLM(tiny_llama_dir, num_pages=10, max_model_len=256, max_num_batched_tokens=64,
                       max_num_seqs=8, warmup=False, progress=False)
    assert _run(llm, prompts) == refs
    assert llm.engine.scheduler.stats().num_preemptions_total > 0


def test_repetition_penalty_matches_transformers_generate(llm, hf, prompts):
    """Same semantics as transformers' RepetitionPenaltyLogitsProcessor (prompt + generated tokens)."""
    for p in prompts[:3]:
        ids = torch.tensor([p])
        want = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=MAX_TOKENS,
                           min_new_tokens=MAX_TOKENS, repetition_penalty=1.6, pad_token_id=0)[0, len(p):].tolist()
        got = llm.generate([p], _params(0.0, 0.0, 1.6), use_tqdm=False)[0].outputs[0].token_ids
        assert got == want


def test_n_greedy_samples_each_count_their_own_tokens(llm, prompts, refs):
    out = llm.generate([prompts[0]], _params(*CASES[0], n=3), use_tqdm=False)[0]
    assert [c.token_ids for c in out.outputs] == [refs[0]] * 3
