"""The draft's LM head cut to the first N token ids (jaxinfer/weights/head_cut.py): its logits are the full
head's on those ids and -inf on the rest, for float and int8 heads, tied and untied; bad sizes get a clear error.
(End to end, greedy outputs with such a draft stay the target's: tests/test_spec_e2e.py, method "draft-cut".)"""
import numpy as np
import pytest
import jax
import jax.numpy as jnp

from jaxinfer.config import ConfigError, SpeculativeConfig
from jaxinfer.config.quantization import parse_quantization
from jaxinfer.weights.head_cut import prune_head
from jaxinfer.weights.loader import load_model, resolve_model

N_KEEP = 256  # of 512


@pytest.fixture(scope="module")
def tied_llama_dir(tmp_path_factory):
    """The tiny random Llama of conftest.tiny_llama_dir with its head tied to the embedding."""
    import torch
    import transformers as tf

    torch.manual_seed(1)
    cfg = tf.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, initializer_range=0.3,
                         tie_word_embeddings=True)
    path = tmp_path_factory.mktemp("tied_llama")
    tf.LlamaForCausalLM(cfg).float().eval().save_pretrained(path)
    return str(path)


def _load(path, quant):
    spec = None if quant is None else parse_quantization(quant, quantize_lm_head=True)
    return load_model(resolve_model(path, "auto"), "float32", progress=False, quantization=spec)


@pytest.mark.parametrize("quant", [None, "int8"])
@pytest.mark.parametrize("tied", [False, True])
def test_cut_head_is_the_full_head_on_the_kept_ids(tiny_llama_dir, tied_llama_dir, tied, quant):
    loaded = _load(tied_llama_dir if tied else tiny_llama_dir, quant)
    assert loaded.cfg.tie_word_embeddings == tied
    cut = prune_head(loaded, N_KEEP)
    h = jax.random.normal(jax.random.key(0), (5, loaded.cfg.hidden_size), jnp.float32)
    full = np.asarray(loaded.module().logits(h))
    part = np.asarray(cut.module().logits(h))
    assert part.shape == full.shape == (5, 512)
    np.testing.assert_allclose(part[:, :N_KEEP], full[:, :N_KEEP], rtol=1e-5, atol=1e-5)
    assert np.all(part[:, N_KEEP:] == -np.inf)
    assert np.all(part.argmax(-1) == full[:, :N_KEEP].argmax(-1))
    head = cut.module().lm_head
    kept = head.w[...].shape[1] if quant is None else head.scale[...].shape[-1]
    assert kept == N_KEEP  # the head itself is smaller (what saves the streaming), not a masked full head
    assert np.array_equal(np.asarray(cut.module().embed[...]), np.asarray(loaded.module().embed[...]))


def test_whole_vocabulary_is_unchanged_and_bad_sizes_are_errors(tiny_llama_dir):
    loaded = _load(tiny_llama_dir, None)
    assert prune_head(loaded, 512) is loaded
    for bad in (0, 513, 200, 1.5, True):
        with pytest.raises(ConfigError, match="draft_head_vocab"):
            prune_head(loaded, bad)
    with pytest.raises(ConfigError, match="only used by method 'draft'"):
        SpeculativeConfig(method="ngram", draft_head_vocab=100)
    with pytest.raises(ConfigError, match="must be an int >= 1"):
        SpeculativeConfig(method="draft", draft_model="x", draft_head_vocab=0)
