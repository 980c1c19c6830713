"""Building blocks shared by the Llama family: RMSNorm, RoPE, linear layers with plain weights.

Weights are `nnx.Param`s holding plain arrays in [in_features, out_features] layout, so the forward pass is
`x @ w`; loaders transpose Hugging Face's [out, in] weights once at load time.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxinfer.config import ModelConfig


def _empty(shape, dtype):
    # Parameters are always replaced by the loader (or by random init under eval_shape); zeros keep
    # module construction cheap and deterministic.
    return jnp.zeros(shape, dtype)


class Linear(nnx.Module):
    """y = x @ w (+ b). w: [in, out]. axes: logical names of (in, out) for jaxinfer.parallel.RULES."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool, dtype, axes=(None, None)):
        self.w = nnx.Param(_empty((in_features, out_features), dtype), logical_axes=tuple(axes))
        self.b = nnx.Param(_empty((out_features,), dtype), logical_axes=(axes[1],)) if bias else None

    def __call__(self, x):
        y = jnp.dot(x, self.w[...])
        if self.b is not None:
            y = y + self.b[...]
        return y


class RMSNorm(nnx.Module):
    """Hugging Face LlamaRMSNorm numerics: normalise in float32, cast back, then scale by the weight."""

    def __init__(self, dim: int, eps: float, dtype, axis: str = "embed"):
        self.weight = nnx.Param(jnp.ones((dim,), dtype), logical_axes=(axis,))
        self.eps = eps

    def __call__(self, x):
        dtype = x.dtype
        x32 = x.astype(jnp.float32)
        var = jnp.mean(x32 * x32, axis=-1, keepdims=True)
        normed = (x32 * jax.lax.rsqrt(var + self.eps)).astype(dtype)
        return self.weight[...] * normed


def rope_cos_sin(positions, inv_freq, dtype):
    """positions: i32[T]; inv_freq: f32[D/2] -> cos, sin: [T, D] (halves repeated, HF rotate-half layout)."""
    freqs = positions.astype(jnp.float32)[:, None] * inv_freq[None, :]  # [T, D/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)  # [T, D]
    return jnp.cos(emb).astype(dtype), jnp.sin(emb).astype(dtype)


def apply_rope(x, cos, sin):
    """x: [T, heads, D]; cos/sin: [T, D]. Rotate-half convention of Hugging Face Llama."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def rope_inv_freq(cfg: ModelConfig):
    """Inverse RoPE frequencies [head_dim // 2] in float64 numpy, with Llama 3 / linear scaling applied."""
    d = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    s = cfg.rope_scaling
    if s is None:
        return inv
    if s.kind == "linear":
        return inv / s.factor
    # llama3: keep high frequencies, divide low ones by `factor`, interpolate smoothly in between.
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > low_wavelen, inv / s.factor, inv)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor)
    smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled)
