"""Every supported family against transformers (float32, CPU): prompt log-probs and greedy tokens.

A tiny random model is built in transformers, saved with save_pretrained, loaded by jaxinfer from the
directory, and compared on a 64-token prompt: log-prob of each prompt token (max abs diff < 1e-4) and 32 greedy
tokens (identical).
"""
import numpy as np
import pytest
import torch
import transformers as tf

import jaxinfer
from jaxinfer import SamplingParams

_BASE = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256, initializer_range=0.1)

FAMILIES = {
    "llama2-mha": (tf.LlamaConfig, tf.LlamaForCausalLM, dict(num_key_value_heads=4)),
    "llama3-gqa": (tf.LlamaConfig, tf.LlamaForCausalLM, dict(rope_theta=500000.0)),
    "llama3.1-rope-scaling": (tf.LlamaConfig, tf.LlamaForCausalLM, dict(rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32})),
    "llama3.2-tied-mqa": (tf.LlamaConfig, tf.LlamaForCausalLM, dict(num_key_value_heads=1,
                                                                      tie_word_embeddings=True)),
    "llama-attention-bias": (tf.LlamaConfig, tf.LlamaForCausalLM, dict(attention_bias=True)),
    "smollm2": (tf.LlamaConfig, tf.LlamaForCausalLM, dict(num_attention_heads=6, num_key_value_heads=2,
                                                           hidden_size=96, tie_word_embeddings=True)),
    "mistral-sliding-window": (tf.MistralConfig, tf.MistralForCausalLM, dict(sliding_window=24)),
    "qwen2-bias": (tf.Qwen2Config, tf.Qwen2ForCausalLM, dict(tie_word_embeddings=False)),
    "qwen3-qk-norm": (tf.Qwen3Config, tf.Qwen3ForCausalLM, dict(head_dim=32)),
}


def _build(name, tmp_path_factory):
    cfg_cls, model_cls, extra = FAMILIES[name]
    torch.manual_seed(abs(hash(name)) % 2**31)
    cfg = cfg_cls(**{**_BASE, **extra})
    model = model_cls(cfg).float().eval()
    with torch.no_grad():  # (transformers initialises biases to zero, which would hide where a bias is added)
        for pname, p in model.named_parameters():
            if pname.endswith("bias"):
                p.normal_(0.0, 0.5)
    path = tmp_path_factory.mktemp(name.replace(".", "_"))
    model.save_pretrained(path)
    return model, str(path)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_matches_transformers(name, tmp_path_factory):
    model, path = _build(name, tmp_path_factory)
    rng = np.random.default_rng(7)
    prompt = rng.integers(3, 320, size=64).tolist()
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0].double()
        ref_lp = torch.log_softmax(logits, -1)[torch.arange(63), torch.tensor(prompt[1:])].numpy()
        model.generation_config.eos_token_id = None  # run all 32 steps; jaxinfer gets ignore_eos=True
        ref_gen = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=32,
                                 attention_mask=torch.ones(1, 64, dtype=torch.long),
                                 pad_token_id=0)[0, 64:].tolist()

    # min_bucket_tokens=64: the 64-token prefill and the 32 decodes run in one bucket (one step program per family;
    # the CPU ladder's 1-token decode bucket is exercised by the other end-to-end tests)
    llm = jaxinfer.LLM(path, dtype="float32", num_pages=64, max_model_len=256, max_num_batched_tokens=64,
                       max_num_seqs=8, min_bucket_tokens=64, progress=False)
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=32, prompt_logprobs=0, ignore_eos=True),
                       use_tqdm=False)[0]
    got_lp = np.array([d[t].logprob for d, t in zip(out.prompt_logprobs[1:], prompt[1:])])
    assert out.prompt_logprobs[0] is None
    np.testing.assert_allclose(got_lp, ref_lp, atol=1e-4, rtol=0)
    assert out.outputs[0].token_ids == ref_gen


def test_sharded_safetensors_with_index(tmp_path_factory):
    """A checkpoint split over several *.safetensors files with model.safetensors.index.json loads the same."""
    model, _ = _build("llama3-gqa", tmp_path_factory)
    path = tmp_path_factory.mktemp("sharded")
    model.save_pretrained(path, max_shard_size="100KB")
    shards = sorted(p.name for p in path.glob("*.safetensors"))
    assert len(shards) > 2 and (path / "model.safetensors.index.json").exists()
    prompt = list(range(3, 40))
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0].double()
        ref_lp = torch.log_softmax(logits, -1)[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])].numpy()
    # test_family_matches_transformers[llama3-gqa]'s engine shape: its programs, from JAX's persistent cache
    llm = jaxinfer.LLM(str(path), dtype="float32", num_pages=64, max_model_len=256, max_num_batched_tokens=64,
                       max_num_seqs=8, min_bucket_tokens=64, progress=False)
    out = llm.generate([prompt], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
    got = np.array([d[t].logprob for d, t in zip(out.prompt_logprobs[1:], prompt[1:])])
    np.testing.assert_allclose(got, ref_lp, atol=1e-4, rtol=0)
