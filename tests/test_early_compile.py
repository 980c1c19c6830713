"""api.py _build_early: a lazy start (warmup=False) compiles the first request's programs from the weights'
shapes (weights/loader.py abstract_model) while the weights load, then puts the real weights in place
(ModelRunner.set_weights). Checked against the ordinary start (weights first, then programs): the same greedy
tokens, real weights in the runner, and the two first buckets compiled or compiling before the first request."""
import jax
import numpy as np
import pytest

import jaxinfer
from jaxinfer import SamplingParams

SMALL = dict(max_model_len=256, num_pages=64, max_num_batched_tokens=64, max_num_seqs=4)
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def test_early_start_matches_ordinary_start(smollm2_gguf):
    sp = SamplingParams(temperature=0, max_tokens=8)
    ref_llm = jaxinfer.LLM(smollm2_gguf, progress=False, **SMALL)  # warm-up: the ordinary path
    ids = ref_llm.tokenizer.apply_chat_template(MESSAGES)
    ref = ref_llm.generate([ids], sp, use_tqdm=False)[0].outputs[0].token_ids
    llm = jaxinfer.LLM(smollm2_gguf, progress=False, warmup=False, first_prompt=MESSAGES, **SMALL)
    r = llm.runner
    assert all(isinstance(p, jax.Array) for p in r.loaded.params)
    started = {b for b, _ in r._pending} | {b for b, _ in r._compiled}
    assert {r.ladder.pick(1, 1), r.ladder.pick(len(ids), 1)} <= started
    out = llm.generate([ids], sp, use_tqdm=False)[0].outputs[0].token_ids
    assert list(out) == list(ref)
    for a, b in zip(r.loaded.params, ref_llm.runner.loaded.params):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_set_weights_rejects_another_shape(smollm2_gguf):
    from jaxinfer.weights.loader import abstract_model

    llm = jaxinfer.LLM(smollm2_gguf, progress=False, warmup=False, **SMALL)
    wrong = abstract_model(llm.source, "bfloat16")  # float32 on CPU: every weight's dtype differs
    with pytest.raises(ValueError, match="does not match"):
        llm.runner.set_weights(wrong)
