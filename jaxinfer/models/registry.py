"""Architecture registry: a Hugging Face architecture name -> the module that runs it and how its weights map.

The loader (weights/loader.py) builds `Architecture.module(cfg, dtype, mlp_blocks=...)` and maps a checkpoint's
tensors with `Architecture.weights`; `model_config(hf)` is the one check of what a config asks for (model_type
and architectures from this table, then everything ModelConfig.from_hf rejects). A new family is one entry here
(+ its module, when the Llama module does not cover it).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from jaxinfer.config import ConfigError, ModelConfig
from jaxinfer.models.llama import LlamaForCausalLM

# Hugging Face checkpoints prefix per-layer tensors with this ("model.layers.{i}.input_layernorm.weight").
HF_LAYER_PREFIX = "model.layers"


@dataclasses.dataclass(frozen=True)
class WeightNames:
    """How a Hugging Face checkpoint's tensors map onto the module's parameters (HF linear weights are [out, in];
    ours are [in, out]: `transposed` says the loader transposes)."""

    top: Mapping[str, tuple[tuple, bool]]    # full HF name -> (parameter path, transposed)
    layer: Mapping[str, tuple[tuple, bool]]  # name under "model.layers.{i}." -> (path under ("layers", i), transposed)
    # Fused parameters (one matmul where HF has several): their paths under ("layers", i).
    qkv: tuple       # q_proj / k_proj / v_proj weight ("w") and bias ("b"), columns grouped per KV head
    gate_up: tuple   # gate_proj / up_proj weights side by side: [in, 2 * intermediate]


LLAMA_WEIGHTS = WeightNames(
    top={
        "model.embed_tokens.weight": (("embed",), False),
        "model.norm.weight": (("norm", "weight"), False),
        "lm_head.weight": (("lm_head", "w"), True),  # skipped when the config ties it to the embeddings
    },
    layer={
        "input_layernorm.weight": (("attn_norm", "weight"), False),
        "post_attention_layernorm.weight": (("mlp_norm", "weight"), False),
        "self_attn.q_norm.weight": (("attn", "q_norm", "weight"), False),  # qwen3
        "self_attn.k_norm.weight": (("attn", "k_norm", "weight"), False),
        "self_attn.o_proj.weight": (("attn", "o", "w"), True),
        "self_attn.o_proj.bias": (("attn", "o", "b"), False),
        "mlp.down_proj.weight": (("mlp", "down", "w"), True),
    },
    qkv=("attn", "qkv"),
    gate_up=("mlp", "gate_up", "w"),
)


@dataclasses.dataclass(frozen=True)
class Architecture:
    name: str        # config.json "architectures" entry
    model_type: str  # config.json "model_type"
    module: type     # the nnx module class: module(cfg: ModelConfig, dtype, mlp_blocks=1)
    weights: WeightNames


ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in (
    Architecture("LlamaForCausalLM", "llama", LlamaForCausalLM, LLAMA_WEIGHTS),
    Architecture("MistralForCausalLM", "mistral", LlamaForCausalLM, LLAMA_WEIGHTS),
    Architecture("Qwen2ForCausalLM", "qwen2", LlamaForCausalLM, LLAMA_WEIGHTS),  # qkv bias
    Architecture("Qwen3ForCausalLM", "qwen3", LlamaForCausalLM, LLAMA_WEIGHTS),  # q/k RMSNorm
)}
SUPPORTED_MODEL_TYPES = tuple(dict.fromkeys(a.model_type for a in ARCHITECTURES.values()))
FAMILIES = "Llama 2/3.x, Mistral, Qwen2/2.5, Qwen3, SmolLM2"


def architecture(hf: Mapping[str, Any]) -> Architecture:
    """The registry entry of a Hugging Face config dict; ConfigError naming the model_type or architecture when
    jaxinfer does not implement it. Without an "architectures" list, the entry of its model_type."""
    model_type = hf.get("model_type")
    archs = hf.get("architectures") or []
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(
            f"unsupported model_type {model_type!r} (architectures {archs}); jaxinfer supports "
            f"{', '.join(SUPPORTED_MODEL_TYPES)} ({FAMILIES})")
    for arch in archs:
        if arch not in ARCHITECTURES:
            raise ConfigError(f"unsupported architecture {arch!r}; jaxinfer supports {sorted(ARCHITECTURES)}")
    if archs:
        return ARCHITECTURES[archs[0]]
    return next(a for a in ARCHITECTURES.values() if a.model_type == model_type)


def model_config(hf: Mapping[str, Any]) -> tuple[Architecture, ModelConfig]:
    """(registry entry, ModelConfig) of a Hugging Face config dict, both validated."""
    arch = architecture(hf)
    return arch, ModelConfig.from_hf(dict(hf))


def hf_architecture_name(model_type: str) -> str:
    """The Hugging Face architecture name of a model_type (GGUF files name only the family)."""
    return next(a.name for a in ARCHITECTURES.values() if a.model_type == model_type)
