"""Named model shapes for random-weight runs (`load_format="dummy"`), like vLLM's dummy loader.

A benchmark needs only a config to build a model at real shapes: `LLM(model="llama3-8b", load_format="dummy")`.
"""
from __future__ import annotations

import copy

_LLAMA3_8B = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "rms_norm_eps": 1e-5, "max_position_embeddings": 8192, "tie_word_embeddings": False,
    "rope_theta": 500000.0, "bos_token_id": 128000, "eos_token_id": 128001, "torch_dtype": "bfloat16",
}

PRESETS: dict[str, dict] = {
    "llama3-8b": _LLAMA3_8B,
    "llama3.2-1b": {**_LLAMA3_8B, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
                    "tie_word_embeddings": True},
    "llama3-70b": {**_LLAMA3_8B, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                   "num_attention_heads": 64, "num_key_value_heads": 8},
    # Small shapes for tests and CPU demos.
    "tiny-llama": {**_LLAMA3_8B, "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
                   "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                   "max_position_embeddings": 1024, "bos_token_id": 1, "eos_token_id": 2,
                   "torch_dtype": "float32"},
}


def preset_config(name: str) -> dict:
    if name not in PRESETS:
        raise KeyError(name)
    return copy.deepcopy(PRESETS[name])
