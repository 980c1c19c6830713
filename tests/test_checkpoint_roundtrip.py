"""`LLM.save` writes an orbax checkpoint that `LLM(path)` reloads with no conversion: identical weights, config,
tokenizer, and identical greedy outputs."""
import json
import os

import jax
import numpy as np
import pytest

import jaxinfer
from jaxinfer import SamplingParams
from jaxinfer.weights.checkpoint import is_orbax_checkpoint

SMALL = dict(max_model_len=256, num_pages=64, max_num_batched_tokens=64, max_num_seqs=4, progress=False)
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
PROMPTS = [[1, 17, 300, 42, 7], list(range(3, 60)), [9]]
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def _assert_same_weights(a, b):
    assert a.treedef == b.treedef
    assert len(a.params) == len(b.params)
    for i, (x, y) in enumerate(zip(a.params, b.params)):
        assert x.shape == y.shape and x.dtype == y.dtype, (i, x.shape, x.dtype, y.shape, y.dtype)
        assert np.array_equal(np.asarray(x).view(np.uint8), np.asarray(y).view(np.uint8)), f"weight {i} differs"


def _tokens(outs):
    return [o.outputs[0].token_ids for o in outs]


# ---- tiny Llama (safetensors, no tokenizer) ----------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_pair(tiny_llama_dir, tmp_path_factory):
    llm = jaxinfer.LLM(tiny_llama_dir, **SMALL)
    path = str(tmp_path_factory.mktemp("tiny_ckpt") / "ckpt")
    llm.save(path)
    return llm, path, jaxinfer.LLM(path, **SMALL)


def test_tiny_checkpoint_layout(tiny_pair, tiny_llama_dir):
    llm, path, llm2 = tiny_pair
    assert is_orbax_checkpoint(path)
    assert os.path.isdir(os.path.join(path, "state"))
    with open(os.path.join(path, "config.json")) as f:
        saved = json.load(f)
    with open(os.path.join(tiny_llama_dir, "config.json")) as f:
        assert saved == json.load(f)
    assert llm.source.kind == "hf" and llm2.source.kind == "orbax"
    assert llm2.source.path == path
    assert llm2.model_config == llm.model_config
    assert llm2.tokenizer is None and llm.tokenizer is None


def test_tiny_weights_equal(tiny_pair):
    llm, _, llm2 = tiny_pair
    assert llm2.model.dtype == llm.model.dtype
    _assert_same_weights(llm.model, llm2.model)
    # restored straight onto the device, not left as host numpy arrays
    assert all(isinstance(p, jax.Array) for p in llm2.model.params)


def test_tiny_greedy_outputs_equal(tiny_pair):
    llm, _, llm2 = tiny_pair
    a = _tokens(llm.generate(PROMPTS, GREEDY, use_tqdm=False))
    b = _tokens(llm2.generate(PROMPTS, GREEDY, use_tqdm=False))
    assert a == b and all(len(t) == 12 for t in a)


def test_save_refuses_a_non_empty_directory(tiny_pair):
    llm, path, _ = tiny_pair
    with pytest.raises(FileExistsError, match="is not empty; pick a new path"):
        llm.save(path)
    assert is_orbax_checkpoint(path)  # and the existing checkpoint is untouched


# ---- SmolLM2 GGUF (dequantized on load; with tokenizer and chat template) -----------------------------------
@pytest.fixture(scope="module")
def smol_pair(smollm2_gguf, tmp_path_factory):
    llm = jaxinfer.LLM(smollm2_gguf, **SMALL)
    path = str(tmp_path_factory.mktemp("smol_ckpt") / "ckpt")
    llm.save(path)
    return llm, path, jaxinfer.LLM(path, **SMALL)


def test_smollm2_reloads_as_orbax(smol_pair):
    llm, path, llm2 = smol_pair
    assert llm.source.kind == "gguf" and llm2.source.kind == "orbax"
    assert llm2.model_config == llm.model_config
    assert llm2.model.dtype == llm.model.dtype
    _assert_same_weights(llm.model, llm2.model)


def test_smollm2_tokenizer_roundtrip(smol_pair):
    llm, path, llm2 = smol_pair
    t1, t2 = llm.tokenizer, llm2.tokenizer
    assert t2 is not None, f"no tokenizer reloaded from {path}: {sorted(os.listdir(path))}"
    assert t2.has_chat_template
    text = "The quick brown fox jumps over the lazy dog. 1234 ünïcödé 日本語"
    assert t2.encode(text) == t1.encode(text)
    assert t2.decode(t1.encode(text)) == t1.decode(t1.encode(text))
    assert t2.apply_chat_template(CHAT) == t1.apply_chat_template(CHAT)
    assert t2.eos_token_ids == t1.eos_token_ids
    assert llm2.engine.scheduler.eos_token_ids == llm.engine.scheduler.eos_token_ids


def test_smollm2_chat_output_equal(smol_pair):
    llm, _, llm2 = smol_pair
    sp = SamplingParams(temperature=0, max_tokens=16)
    a = llm.chat(CHAT, sp, use_tqdm=False)[0].outputs[0]
    b = llm2.chat(CHAT, sp, use_tqdm=False)[0].outputs[0]
    assert a.text.strip() and "Paris" in a.text
    assert (b.token_ids, b.text, b.finish_reason) == (a.token_ids, a.text, a.finish_reason)
