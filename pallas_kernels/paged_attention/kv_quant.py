"""Quantized KV cache (`kv_cache_dtype="fp8" | "int8"`): the storage format, quantize-on-write, and the size.

Design: one float32 scale per (token, KV head), kept in a small parallel pool next to the pages.

  data  [num_pages, page_size, kv_heads, head_dim]  float8_e4m3fn or int8
  scale [num_pages, page_size, kv_heads]            float32;  k = data * scale[..., None]

Why per token and head (not per page, not fixed per layer):
  * It is computed when the token is written, from that token's own values (amax over head_dim), so nothing has
    to be calibrated and a page never needs re-quantizing when later tokens with a larger range arrive (a
    per-page scale would: the first token of a page fixes nothing about the 15 that follow).
  * Outlier tokens (attention sinks, the BOS token, whose keys are often 10x larger) do not cost the other
    tokens their precision.
  * It folds into attention for free: s = q . (k_q * s_k) = (q . k_q) * s_k is one multiply per score column,
    and p . (v_q * s_v) = (p * s_v) . v_q one multiply per probability; the pages themselves are never
    dequantized into a float copy.
Cost: 4 bytes per (token, head) next to head_dim bytes of data: at head_dim 128 a token's KV takes
(128 + 4) / 256 = 52% of bf16's bytes (1.94x the pages for the same memory), 53% at head_dim 64 / f32 scale
vs bf16 (1.88x), and 26% / 27% of float32's.

fp8 is e4m3 (max 448): per-token scaling puts each token's largest element at 448, so the 3-bit mantissa
gives ~3% relative error per element. int8 is symmetric round-to-nearest (max 127): error <= amax / 254.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

# kv_cache_dtype -> (storage dtype, largest representable magnitude used by the scale)
KV_QUANT_FORMATS = {
    "fp8": (jnp.float8_e4m3fn, 448.0),
    "int8": (jnp.int8, 127.0),
}


class QuantizedPages(NamedTuple):
    """One of K or V of one layer, quantized (a pytree: jit / donation treat it like the plain page array)."""

    data: jax.Array   # [num_pages, page_size, kv_heads, head_dim] float8_e4m3fn | int8
    scale: jax.Array  # f32[num_pages, page_size, kv_heads]


def check_kv_cache_dtype(kind: str) -> None:
    if kind not in KV_QUANT_FORMATS:
        raise ValueError(f"kv_cache_dtype {kind!r} is not a quantized KV format; use one of "
                         f"{sorted(KV_QUANT_FORMATS)} (or 'auto' for the model dtype)")


def storage_dtype(kind: str):
    check_kv_cache_dtype(kind)
    return KV_QUANT_FORMATS[kind][0]


def cache_dtype(kind: str, model_dtype):
    """The dtype of the elements a KV cache of this kind stores: the model's for "auto", else storage_dtype."""
    return model_dtype if kind == "auto" else storage_dtype(kind)


def bytes_per_token_head(kind: str, head_dim: int, model_itemsize: int) -> int:
    """Bytes one token's K (or V) of one KV head takes in the cache: data (+ its float32 scale if quantized)."""
    if kind == "auto":
        return head_dim * model_itemsize
    check_kv_cache_dtype(kind)
    return head_dim * jnp.dtype(KV_QUANT_FORMATS[kind][0]).itemsize + 4


def empty_pages(kind: str, shape, model_dtype):
    """Zero-filled pages (and scales) of one of K / V of a layer: attention masks unwritten slots by weight,
    and 0 * NaN would still poison the sum, so the pool must start finite."""
    if kind == "auto":
        return jnp.zeros(shape, model_dtype)
    return QuantizedPages(jnp.zeros(shape, storage_dtype(kind)), jnp.zeros(shape[:-1], jnp.float32))


def quantize_kv(x, dtype):
    """x: [T, kv_heads, head_dim] float -> (q [T, kv_heads, head_dim] of `dtype`, f32 scale [T, kv_heads]).

    Symmetric, one scale per token and head: scale = amax / qmax, so dequantize(q) = q * scale."""
    qmax = 448.0 if jnp.dtype(dtype) == jnp.float8_e4m3fn else 127.0
    xf = x.astype(jnp.float32)
    amax = jnp.max(jnp.abs(xf), axis=-1)                       # [T, kvh]
    scale = amax / qmax
    y = xf / jnp.where(scale > 0, scale, 1.0)[..., None]       # an all-zero row stays zero
    if jnp.issubdtype(dtype, jnp.integer):
        q = jnp.clip(jnp.round(y), -qmax, qmax).astype(dtype)
    else:  # clip: f32 rounding can put amax / scale a hair above 448, and e4m3fn has no inf (it would be NaN)
        q = jnp.clip(y, -qmax, qmax).astype(dtype)
    return q, scale


def dequantize_pages(pages) -> jax.Array:
    """float32 pages (tests / debugging); a plain page array is returned as float32 unchanged."""
    if isinstance(pages, QuantizedPages):
        return pages.data.astype(jnp.float32) * pages.scale[..., None]
    return pages.astype(jnp.float32)
