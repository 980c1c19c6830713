"""Quantized matmul as XLA formulations that XLA's GPU compiler may fuse into its GEMMs (no custom kernel): the
alternatives to the Pallas-Triton kernels (kernel.py), which stream 0.4-0.9 TB/s at M <= 16 where XLA's bf16
dot streams 2.9-3.9 TB/s (issue 20). Which one wins is decided per M by benchmarks/kernels/quantized_matmul.py
on the GPU; the engine's table (jaxinfer/models/quant_paths.py) takes the measured winners.

Backend: plain XLA (jnp / lax). Why: XLA already streams bf16 weights at ~3 TB/s at small M (cuBLAS GEMV /
Triton GEMM fusions), the fp8 W8A8 dot through XLA is the one quantized path that beat bf16 (1.26x batch-1
decode), and XLA's GPU compiler has native int8 GEMMs (s8 x s8 -> s32, IMMA tensor cores) and packed s4
arrays whose s4 -> bf16 convert its Triton GEMM emitter fuses into the operand load. Each formulation below is
one way to hand XLA a shape it may fuse; none needs a custom call, so all run on CPU (tests) and under SPMD.

int8 (weights: the int8 layout of reference.py, q int8 [K, N] | the transposed q_t [N, K], scale f32 [N]):
  int8_w8a8_xla      W8A8: x quantized per token to int8 (reference.quantize_activations_int8), one int8 x int8
                     -> int32 dot (exact), then * x_scale[:, None] * scale[None, :] in f32. Changes numerics:
                     the activations are rounded to 8 bits (bounded against the float result in the tests).
  int8_mixed_xla     weight-only: lax.dot_general(x bf16, q int8) with mixed operand types and f32 output, so
                     XLA sees the convert inside the dot (no separate dequantized weight), * scale on the output.
  int8_convert_xla   weight-only: x @ q.astype(bf16) (the convert as an operand fusion), any layout.
int4 (weights: the XLA-native layout of reference.py, q int4 [K, N] signed, scale / offset [K/g, N]):
  int4_native_dequant_xla   w = (q.astype(bf16) [G, g, N] * scale[:, None]) (+ offset) -> [K, N], one dot: the
                            dequantization is an elementwise prologue of the dot's weight operand, which XLA may
                            fuse into its Triton GEMM (one rounding of each dequantized weight to bf16).
  int4_native_grouped_xla   per-group partial sums: x [M, G, g] . q [G, g, N] batched over the G groups -> [G, M,
                            N] f32 (raw integers, exact in bf16), then sum_G p * scale (+ rowsum(x_g) @ offset).
                            The partials cost M * G * N * 4 bytes: meant for small M (decode); past
                            GROUPED_MAX_BYTES it falls back to the dequant form. mixed=True hands the dot the int4
                            operand itself (mixed-type dot) instead of q.astype(bf16).
  int4_native_nk_dequant_xla  the dequant form on the transposed layout q int4 [N, K] ('native-nk', the Mosaic
                            kernel's: mosaic_int4.py), contracted over the contiguous K.
  int4_native_nk_w4a8_xla   W4A8 on 'native-nk' for many-token steps: the weights dequantized and rounded to e4m3
                            per output channel (c_n from the scales / offsets alone: no pass over the weights), the
                            activations to e4m3 per token, then XLA's fp8 dot (twice the bf16 tensor-core rate on
                            Hopper). Changes numerics: a second rounding of every weight and the activations'.
All take x [..., K] (bf16 or f32) and return [..., N] in out_dtype (default x.dtype).

Why no seventh Pallas-Triton variant (a small-M split-K kernel on weights pre-shuffled for 16-byte loads): the
kernel's weight blocks are already contiguous along N ([g/2, bn] bytes of a row-major [K/2, N] array: 128-byte
coalesced rows), so a Marlin-style shuffle changes the load width, not the coalescing, and Pallas-Triton exposes
neither the vector width nor cp.async / TMA staging beyond num_stages; six block / split-K / stage variants
(results/kernel-quantized-matmul-sweep-2026-12-01.json) stayed at 0.4-0.9 TB/s. Without a measured reason that
the shuffle is the bottleneck, the formulations above (which reuse XLA's own tuned GEMV / GEMM emitters) are the
better bet; a Mosaic GPU kernel with explicit TMA pipelines is the follow-up if none of them reaches the target.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from pallas_kernels.quantized_matmul.reference import FP8, FP8_MAX, quantize_activations_int8
from pallas_kernels.quantized_matmul.xla import fp8_matmul_xla

GROUPED_MAX_BYTES = 256 << 20   # f32 [G, M, N] partials of the grouped int4 form above this: use the dequant form
LAYOUTS = ("kn", "nk")          # int8 weight layout: q [K, N] (the model's) or q_t [N, K] (K contiguous)


def _as_2d(x):
    return x.reshape(-1, x.shape[-1]), x.shape[:-1]


def _contract(layout: str):
    """dot_general dimension numbers of x [M, K] against the weight in `layout`."""
    if layout not in LAYOUTS:
        raise ValueError(f"int8 weight layout must be one of {LAYOUTS}, got {layout!r}")
    return (((1,), (0,)), ((), ())) if layout == "kn" else (((1,), (1,)), ((), ()))


def _n(q, layout):
    return q.shape[1] if layout == "kn" else q.shape[0]


def _check(x, K, what):
    if x.shape[-1] != K:
        raise ValueError(f"x must be [..., {K}] ({what}'s input dimension), got shape {tuple(x.shape)}")


# ---- int8 ---------------------------------------------------------------------------------------------------
def int8_w8a8_xla(x, q, scale, *, layout: str = "kn", out_dtype=None):
    """W8A8 int8: per-token int8 activations x int8 weights -> int32 (XLA's integer GEMM), scales on the output.
    q: int8 [K, N] (layout 'kn') or [N, K] ('nk'); scale f32 [N]."""
    dims = _contract(layout)
    K = q.shape[0] if layout == "kn" else q.shape[1]
    _check(x, K, "q")
    x2, lead = _as_2d(x)
    xq, xs = quantize_activations_int8(x2)                                   # int8 [M, K], f32 [M]
    acc = lax.dot_general(xq, q, dims, preferred_element_type=jnp.int32)    # [M, N] exact integers
    y = acc.astype(jnp.float32) * xs[:, None] * scale.astype(jnp.float32)[None, :]
    return y.astype(out_dtype or x.dtype).reshape(*lead, _n(q, layout))


def int8_mixed_xla(x, q, scale, *, layout: str = "kn", out_dtype=None):
    """Weight-only int8 as one mixed-type dot: dot_general(x, q int8) with f32 output, * scale [N] after."""
    dims = _contract(layout)
    _check(x, q.shape[0] if layout == "kn" else q.shape[1], "q")
    x2, lead = _as_2d(x)
    y = lax.dot_general(x2, q, dims, preferred_element_type=jnp.float32) * scale.astype(jnp.float32)[None, :]
    return y.astype(out_dtype or x.dtype).reshape(*lead, _n(q, layout))


def int8_convert_xla(x, q, scale, *, layout: str = "kn", out_dtype=None):
    """Weight-only int8: x @ q.astype(x.dtype) (integers are exact in bf16), f32 accumulation, * scale after."""
    dims = _contract(layout)
    _check(x, q.shape[0] if layout == "kn" else q.shape[1], "q")
    x2, lead = _as_2d(x)
    y = lax.dot_general(x2, q.astype(x.dtype), dims, preferred_element_type=jnp.float32)
    y = y * scale.astype(jnp.float32)[None, :]
    return y.astype(out_dtype or x.dtype).reshape(*lead, _n(q, layout))


# ---- int4, XLA-native layout --------------------------------------------------------------------------------
def _check_int4(x, q, scale, offset, group_size):
    if q.ndim != 2 or jnp.dtype(q.dtype) != jnp.dtype(jnp.int4):
        raise TypeError(f"native int4 weights must be int4 [K, N], got {q.dtype} {tuple(q.shape)}")
    K, N = q.shape
    if not group_size or K % group_size:
        raise ValueError(f"int4 group_size {group_size} must divide K={K}")
    G = K // group_size
    if tuple(scale.shape) != (G, N) or (offset is not None and tuple(offset.shape) != (G, N)):
        raise ValueError(f"int4 scale (and offset) must be [K/g, N]=({G}, {N}), got {tuple(scale.shape)}"
                         + ("" if offset is None else f" and {tuple(offset.shape)}"))
    _check(x, K, "q")
    return K, N, G


def int4_native_dequant_xla(x, q, scale, offset, *, group_size: int, out_dtype=None):
    """Dequantize to x.dtype as the dot's operand prologue, then one dot with f32 accumulation."""
    K, N, G = _check_int4(x, q, scale, offset, group_size)
    x2, lead = _as_2d(x)
    dt = x.dtype
    w = q.astype(dt).reshape(G, group_size, N) * scale.astype(dt)[:, None, :]
    if offset is not None:
        w = w + offset.astype(dt)[:, None, :]
    y = jnp.dot(x2, w.reshape(K, N), preferred_element_type=jnp.float32)
    return y.astype(out_dtype or x.dtype).reshape(*lead, N)


def int4_native_nk_dequant_xla(x, q, scale, offset, *, group_size: int, out_dtype=None):
    """The 'native-nk' layout (q int4 [N, K], scale / offset [K/g, N]): dequantize to x.dtype as the dot's operand
    prologue, contracted over the weight's contiguous K, f32 accumulation (the Mosaic kernel's path above M = 16)."""
    if q.ndim != 2:
        raise TypeError(f"native-nk int4 weights must be int4 [N, K], got {q.dtype} {tuple(q.shape)}")
    N, K = q.shape
    _check_int4(x, q.T, scale, offset, group_size)
    x2, lead = _as_2d(x)
    dt = x.dtype
    G = K // group_size
    w = q.astype(dt).reshape(N, G, group_size) * scale.astype(dt).T[:, :, None]
    if offset is not None:
        w = w + offset.astype(dt).T[:, :, None]
    y = lax.dot_general(x2, w.reshape(N, K), (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    return y.astype(out_dtype or x.dtype).reshape(*lead, N)


def int4_channel_bound(scale, offset):
    """f32 [N]: max |q s + o| over q in [-8, 7] and the K/g groups of each output channel ('native-nk' scale /
    offset [K/g, N]; offset None: symmetric, w = q s). A bound on |w| from the scales alone: equal to the largest
    |w| for asymmetric round-to-nearest (codes 0..15 reached), 8/7 of it for symmetric (codes -7..7; a GGUF Q4_0
    weight may use -8). e4m3's relative precision does not depend on that factor."""
    s = scale.astype(jnp.float32)
    if offset is None:
        return 8.0 * jnp.max(jnp.abs(s), axis=0)
    o = offset.astype(jnp.float32)
    return jnp.max(jnp.maximum(jnp.abs(o - 8.0 * s), jnp.abs(o + 7.0 * s)), axis=0)


def int4_native_nk_w4a8_xla(x, q, scale, offset, *, group_size: int, out_dtype=None):
    """x [..., K] @ (q int4 [N, K] * scale (+ offset) [K/g, N] per group).T -> [..., N], through XLA's fp8 dot:

      c [N]        = int4_channel_bound(scale, offset) / 448                  (e4m3's largest finite value)
      w8 [N, K]    = e4m3((q s + o) / c)                                       (one elementwise pass: int4 in, fp8 out)
      xq, xs       = quantize_activations_fp8(x)                               (per token, as fp8 W8A8)
      y            = dot(xq, w8) (f32 accumulation, bf16 out for a bf16 result) * xs[:, None] * c[None, :]

    For steps of many tokens, where the dot is compute-bound: its fp8 rate is twice bf16's on Hopper, and the
    pass over the weights (int4 read, fp8 written, ~10 GB a step on the 8B shape) is paid once a step."""
    if q.ndim != 2:
        raise TypeError(f"native-nk int4 weights must be int4 [N, K], got {q.dtype} {tuple(q.shape)}")
    N, K = q.shape
    _check_int4(x, q.T, scale, offset, group_size)
    out_dtype = jnp.dtype(out_dtype or x.dtype)
    x2, lead = _as_2d(x)
    G = K // group_size
    c = jnp.maximum(int4_channel_bound(scale, offset), 1e-30) / FP8_MAX                      # [N]
    s = (scale.astype(jnp.float32) / c[None, :]).T[:, :, None]                              # [N, G, 1]
    w = q.astype(jnp.float32).reshape(N, G, group_size) * s
    if offset is not None:
        w = w + (offset.astype(jnp.float32) / c[None, :]).T[:, :, None]
    w8 = jnp.clip(w, -FP8_MAX, FP8_MAX).astype(FP8).reshape(N, K)
    return fp8_matmul_xla(x2, w8, c, out_dtype=out_dtype).reshape(*lead, N)   # fp8 W8A8 on the rounded weights


def int4_native_grouped_xla(x, q, scale, offset, *, group_size: int, out_dtype=None, mixed: bool = False):
    """Per-group partial sums on the raw integers, scaled per group in f32 (see the module docstring)."""
    K, N, G = _check_int4(x, q, scale, offset, group_size)
    x2, lead = _as_2d(x)
    M = x2.shape[0]
    if M * G * N * 4 > GROUPED_MAX_BYTES:
        return int4_native_dequant_xla(x, q, scale, offset, group_size=group_size, out_dtype=out_dtype)
    g = group_size
    xg = x2.reshape(M, G, g)
    qg = q.reshape(G, g, N)
    if not mixed:
        qg = qg.astype(x.dtype)
    # batch G (x dim 1, q dim 0), contract g (x dim 2, q dim 1) -> [G, M, N]
    p = lax.dot_general(xg, qg, (((2,), (1,)), ((1,), (0,))), preferred_element_type=jnp.float32)
    y = jnp.einsum("gmn,gn->mn", p, scale.astype(jnp.float32))
    if offset is not None:
        xs = jnp.sum(xg.astype(jnp.float32), axis=2)                          # [M, G]
        y = y + jnp.dot(xs, offset.astype(jnp.float32), precision=lax.Precision.HIGHEST)
    return y.astype(out_dtype or x.dtype).reshape(*lead, N)
