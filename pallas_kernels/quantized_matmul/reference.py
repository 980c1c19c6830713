"""Quantized matmul, pure jnp: the specification of the device weight layouts and the CPU path.

Every function here dequantizes the weights to float32 and multiplies with float32 accumulation (precision
HIGHEST), so it is the exact value the kernels (kernel.py, xla.py) must reproduce up to accumulation order.

Device layouts of one linear weight W [K, N] (K = in_features, N = out_features, y = x @ W):

  int8  q      int8  [K, N]      per-output-channel symmetric:      W = q * scale
        scale  f32   [N]
  int4  packed uint8 [K/2, N]    group-wise, two 4-bit values a byte: W = u * scale + offset   (per group of g rows)
        scale  dt    [K/g, N]    u in [0, 15] is the unsigned nibble; symmetric weights store u = q + 8 with
        offset dt    [K/g, N]    offset = -8 * scale, asymmetric ones u = q with offset = -zero * scale
                                 (dt = the model's dtype: bf16 on GPU)
  fp8   q_t    e4m3  [N, K]      per-output-channel scales, stored transposed (K contiguous, the operand layout
        scale  f32   [N]         cuBLASLt's fp8 GEMM wants, so XLA inserts no transpose):  W = q_t.T * scale
        activations are quantized per token to e4m3 on the fly (W8A8): x = xq * x_scale[:, None].

int4 packing (`pack_int4`): within each group of g rows, byte j of the group's g/2 packed rows holds row j in its
low nibble and row j + g/2 in its high nibble. A kernel that walks K one group at a time then gets the two halves
of the group from one [g/2, N] byte block with a mask and a shift: no interleaving of rows is needed, and the
two halves meet x[:, group start : + g/2] and x[:, group start + g/2 : + g] in two plain dots.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

FP8 = jnp.float8_e4m3fn
FP8_MAX = float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)  # 448
_HIGHEST = jax.lax.Precision.HIGHEST


# ---- int4 packing (numpy or jnp, same code) ---------------------------------------------------------------
def pack_int4(u, group_size: int):
    """u: uint8 [K, N] with values in [0, 15] -> uint8 [K/2, N] in the group-halves layout above."""
    xp = jnp if isinstance(u, jax.Array) else np
    K, N = u.shape
    g = group_size
    u = u.reshape(K // g, 2, g // 2, N)
    lo, hi = u[:, 0], u[:, 1]                                          # [K/g, g/2, N] each
    return (lo | (hi << 4)).astype(xp.uint8).reshape(K // 2, N)


def unpack_int4(packed, group_size: int):
    """uint8 [K/2, N] -> uint8 [K, N] with values in [0, 15] (inverse of pack_int4)."""
    xp = jnp if isinstance(packed, jax.Array) else np
    K2, N = packed.shape
    g = group_size
    p = packed.reshape(K2 * 2 // g, g // 2, N)
    lo, hi = p & 0xF, p >> 4
    return xp.stack([lo, hi], axis=1).reshape(K2 * 2, N).astype(xp.uint8)


def dequantize_int4(packed, scale, offset, group_size: int):
    """float32 [K, N] = u * scale + offset, scale/offset repeated over the g rows of their group."""
    u = unpack_int4(packed, group_size).astype(jnp.float32)
    s = jnp.repeat(scale.astype(jnp.float32), group_size, axis=0)
    o = jnp.repeat(offset.astype(jnp.float32), group_size, axis=0)
    return u * s + o


# ---- fp8 activations ----------------------------------------------------------------------------------------
def quantize_activations_fp8(x):
    """Dynamic per-token scales: x [M, K] -> (xq e4m3 [M, K], x_scale f32 [M]) with x ~ xq * x_scale[:, None].
    Shared by the reference and the GPU path, so both see the same quantized activations."""
    x32 = x.astype(jnp.float32)
    amax = jnp.max(jnp.abs(x32), axis=-1)
    x_scale = jnp.maximum(amax, 1e-12) / FP8_MAX                      # [M]; all-zero (padding) rows stay zero
    xq = jnp.clip(x32 / x_scale[:, None], -FP8_MAX, FP8_MAX).astype(FP8)
    return xq, x_scale


# ---- references ---------------------------------------------------------------------------------------------
def _as_2d(x):
    return x.reshape(-1, x.shape[-1]), x.shape[:-1]


def int8_matmul_reference(x, q, scale, *, out_dtype=None):
    """x [..., K] @ (q int8 [K, N] * scale f32 [N]) -> [..., N] in out_dtype (default x.dtype)."""
    x2, lead = _as_2d(x)
    w = q.astype(jnp.float32) * scale.astype(jnp.float32)[None, :]
    y = jnp.dot(x2.astype(jnp.float32), w, precision=_HIGHEST)
    return y.astype(out_dtype or x.dtype).reshape(*lead, q.shape[1])


def int4_matmul_reference(x, packed, scale, offset, *, group_size: int, out_dtype=None):
    """x [..., K] @ dequantize_int4(packed [K/2, N], scale, offset [K/g, N]) -> [..., N]."""
    x2, lead = _as_2d(x)
    w = dequantize_int4(packed, scale, offset, group_size)
    y = jnp.dot(x2.astype(jnp.float32), w, precision=_HIGHEST)
    return y.astype(out_dtype or x.dtype).reshape(*lead, packed.shape[1])


def fp8_matmul_reference(x, q_t, scale, *, out_dtype=None):
    """W8A8: quantize x per token to e4m3, then (xq * x_scale) @ (q_t.T * scale) in float32.
    q_t: e4m3 [N, K]; scale: f32 [N]."""
    x2, lead = _as_2d(x)
    xq, xs = quantize_activations_fp8(x2)
    y = jnp.dot(xq.astype(jnp.float32), q_t.astype(jnp.float32).T, precision=_HIGHEST)
    y = y * xs[:, None] * scale.astype(jnp.float32)[None, :]
    return y.astype(out_dtype or x.dtype).reshape(*lead, q_t.shape[0])


# ---- int8 activations (W8A8 int8) ---------------------------------------------------------------------------
INT8_MAX = 127.0


def quantize_activations_int8(x):
    """Dynamic per-token symmetric int8: x [M, K] -> (xq int8 [M, K], x_scale f32 [M]), x ~ xq * x_scale[:, None],
    x_scale = max|x[m]| / 127 (round to nearest even). Shared by the reference and the XLA path (xla_fused.py), so
    both see the same integers; all-zero (padding) rows get scale 1e-12 / 127 and stay zero."""
    x32 = x.astype(jnp.float32)
    amax = jnp.max(jnp.abs(x32), axis=-1)
    x_scale = jnp.maximum(amax, 1e-12) / INT8_MAX                      # [M]
    xq = jnp.clip(jnp.round(x32 / x_scale[:, None]), -INT8_MAX, INT8_MAX).astype(jnp.int8)
    return xq, x_scale


def int8_w8a8_matmul_reference(x, q, scale, *, out_dtype=None):
    """W8A8 int8: quantize x per token to int8 (quantize_activations_int8), then (xq * x_scale) @ (q * scale) in
    float32. q: int8 [K, N] (the int8 layout above); scale f32 [N]. NOTE: this is NOT the value of
    int8_matmul_reference: the activations are rounded too (relative error ~ 1/127 of each row's max)."""
    x2, lead = _as_2d(x)
    xq, xs = quantize_activations_int8(x2)
    y = jnp.dot(xq.astype(jnp.float32), q.astype(jnp.float32), precision=_HIGHEST)
    y = y * xs[:, None] * scale.astype(jnp.float32)[None, :]
    return y.astype(out_dtype or x.dtype).reshape(*lead, q.shape[1])


# ---- int4, XLA-native layout --------------------------------------------------------------------------------
# int4n  q      int4  [K, N]      signed 4-bit values (XLA packs two a byte on the device), group-wise:
#        scale  dt    [K/g, N]    W = q * scale (+ offset), per group of g rows; offset dt [K/g, N] only for
#        offset dt    [K/g, N]    asymmetric weights (None when symmetric: W = q * scale, no offset bytes).
# From the packed layout's unsigned nibble u = q + 8:  W = u * s + o = q * s + (o + 8 s), so offset_n = o + 8 s,
# which is exactly 0 for symmetric weights (o = -8 s).
def int4_native_from_u(u, scale, offset=None):
    """Unsigned nibbles u [K, N] (0..15, the packed layout's values before packing), scale and offset [K/g, N]
    (packed-layout conventions; offset None = symmetric, o = -8 s) -> (q int4 [K, N], scale, offset_n or None)."""
    q = (u.astype(jnp.int32) - 8).astype(jnp.int4)
    if offset is None:
        return q, scale, None
    return q, scale, (offset.astype(jnp.float32) + 8.0 * scale.astype(jnp.float32)).astype(scale.dtype)


def dequantize_int4_native(q, scale, offset, group_size: int):
    """float32 [K, N] = q * scale (+ offset), scale / offset repeated over the g rows of their group."""
    w = q.astype(jnp.float32) * jnp.repeat(scale.astype(jnp.float32), group_size, axis=0)
    if offset is not None:
        w = w + jnp.repeat(offset.astype(jnp.float32), group_size, axis=0)
    return w


def int4_native_matmul_reference(x, q, scale, offset, *, group_size: int, out_dtype=None):
    """x [..., K] @ dequantize_int4_native(q int4 [K, N], scale, offset [K/g, N] or None) -> [..., N]."""
    x2, lead = _as_2d(x)
    w = dequantize_int4_native(q, scale, offset, group_size)
    y = jnp.dot(x2.astype(jnp.float32), w, precision=_HIGHEST)
    return y.astype(out_dtype or x.dtype).reshape(*lead, q.shape[1])
