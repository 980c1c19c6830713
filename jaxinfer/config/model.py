"""ModelConfig: the shape and numerics of a Llama-family decoder, read from a Hugging Face `config.json` (or the dict
built from GGUF metadata). Everything the model code does not implement is rejected with an error naming the
option (which families exist is models/registry.py's table), so an unsupported checkpoint never produces silently
wrong text. ConfigError is the error every config module raises.
"""
from __future__ import annotations

import dataclasses
from typing import Any

_SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


class ConfigError(ValueError):
    """An option jaxinfer does not support, or an invalid value."""


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling. `kind` is "linear" or "llama3" (Llama 3.1+)."""

    kind: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a Llama-family decoder (Llama 2/3.x, Mistral, Qwen2/2.5, Qwen3, SmolLM2)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2 and Llama with attention_bias
    o_bias: bool = False  # Llama with attention_bias
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k before RoPE
    sliding_window: int | None = None  # Mistral v0.1: attend to at most this many previous tokens
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    dtype: str = "bfloat16"  # the checkpoint's own dtype (torch_dtype)

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of num_key_value_heads "
                f"({self.num_kv_heads})")

    @property
    def q_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def qkv_size(self) -> int:
        """Width of the fused QKV projection: [q heads of kv head 0, k0, v0, q heads of kv head 1, ...]."""
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim

    def num_params(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        per_layer = h * self.qkv_size + self.num_heads * self.head_dim * h + 3 * h * i + 2 * h
        if self.qkv_bias:
            per_layer += self.qkv_size
        if self.o_bias:
            per_layer += h
        if self.qk_norm:
            per_layer += 2 * self.head_dim
        head = 0 if self.tie_word_embeddings else h * v
        return v * h + self.num_layers * per_layer + h + head

    def kv_bytes_per_token(self, itemsize: int) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * itemsize

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "ModelConfig":
        """Build from a Hugging Face config dict; reject the options the model code does not implement. Which
        model_type / architectures exist is the registry's table: models/registry.model_config(hf) checks those
        and then calls this (the loader and `jaxinfer info` go through it)."""
        model_type = hf.get("model_type")
        act = hf.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"unsupported hidden_act {act!r}: only 'silu' (SwiGLU MLP) is implemented")
        if hf.get("mlp_bias"):
            raise ConfigError("unsupported option mlp_bias=True: the MLP projections have no bias in jaxinfer")
        if hf.get("pretraining_tp", 1) not in (1, None):
            # pretraining_tp only changes how transformers slices the matmul; the math is the same.
            pass
        hidden = int(hf["hidden_size"])
        num_heads = int(hf["num_attention_heads"])
        head_dim = hf.get("head_dim") or hidden // num_heads
        rope_theta, rope_scaling = _rope_from_hf(hf)
        attention_bias = bool(hf.get("attention_bias", False))
        qkv_bias = model_type == "qwen2" or attention_bias
        o_bias = model_type in ("llama", "mistral") and attention_bias
        sliding_window = _sliding_window_from_hf(hf, model_type)
        eos = hf.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (int(eos),))
        dtype = str(hf.get("torch_dtype") or hf.get("dtype") or "bfloat16").replace("torch.", "")
        return cls(
            model_type=model_type,
            vocab_size=int(hf["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(hf["intermediate_size"]),
            num_layers=int(hf["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            qk_norm=model_type == "qwen3",
            sliding_window=sliding_window,
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos_ids,
            dtype=dtype,
        )


def _rope_from_hf(hf: dict[str, Any]) -> tuple[float, RopeScaling | None]:
    # transformers >= 5 writes `rope_parameters` (with rope_theta inside); older configs write
    # `rope_theta` + `rope_scaling`.
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    merged = {**params, **scaling}
    kind = merged.get("rope_type", merged.get("type", "default")) or "default"
    if kind not in _SUPPORTED_ROPE_TYPES:
        raise ConfigError(
            f"unsupported rope scaling type {kind!r}; jaxinfer implements {', '.join(_SUPPORTED_ROPE_TYPES)}")
    if kind == "default":
        return theta, None
    factor = float(merged["factor"])
    if kind == "linear":
        return theta, RopeScaling(kind="linear", factor=factor)
    return theta, RopeScaling(
        kind="llama3",
        factor=factor,
        low_freq_factor=float(merged.get("low_freq_factor", 1.0)),
        high_freq_factor=float(merged.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(merged.get("original_max_position_embeddings", 8192)),
    )


def _sliding_window_from_hf(hf: dict[str, Any], model_type: str) -> int | None:
    window = hf.get("sliding_window")
    if model_type in ("qwen2", "qwen3"):
        if hf.get("use_sliding_window"):
            raise ConfigError(
                f"unsupported option use_sliding_window=True for {model_type} (per-layer windows); "
                "use a checkpoint with use_sliding_window=false")
        return None
    if window is None:
        return None
    window = int(window)
    return window if window < int(hf.get("max_position_embeddings", 0) or 1 << 30) else None
