"""Building blocks shared by the Llama family: RMSNorm, RoPE, linear layers with plain weights.

Weights are `nnx.Param`s holding plain arrays in [in_features, out_features] layout, so the forward pass is
`x @ w`; loaders transpose Hugging Face's [out, in] weights once at load time.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


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
