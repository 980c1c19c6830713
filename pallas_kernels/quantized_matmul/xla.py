"""Quantized matmul through plain XLA ops on the device layouts of reference.py: the fp8 W8A8 path of the
engine on GPU, and the "XLA int8 / int4 dot" peers the kernels are measured against (and the fallback for
shapes the Pallas kernel does not take).

Unlike the references these dequantize into the activation dtype (bf16) and let XLA's GEMM accumulate in f32.
Measured on the H200 (/work/shared/ANCHORS.md): XLA does not fuse the int8 -> bf16 convert well enough to beat
the bf16 dot, and hand-packed int4 (shift / mask) does not fuse into the GEMM at all; a kernel must do better.
"""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp

from pallas_kernels.quantized_matmul.reference import dequantize_int4, quantize_activations_fp8


def _as_2d(x):
    return x.reshape(-1, x.shape[-1]), x.shape[:-1]


def int8_matmul_xla(x, q, scale, *, out_dtype=None):
    """x [..., K] @ q int8 [K, N], then * scale [N] on the f32 output."""
    x2, lead = _as_2d(x)
    y = jnp.dot(x2, q.astype(x.dtype), preferred_element_type=jnp.float32) * scale.astype(jnp.float32)
    return y.astype(out_dtype or x.dtype).reshape(*lead, q.shape[1])


def int4_matmul_xla(x, packed, scale, offset, *, group_size: int, out_dtype=None):
    """Unpack + dequantize to x.dtype (a separate XLA pass over the weights), then one GEMM."""
    x2, lead = _as_2d(x)
    w = dequantize_int4(packed, scale, offset, group_size).astype(x.dtype)
    y = jnp.dot(x2, w, preferred_element_type=jnp.float32)
    return y.astype(out_dtype or x.dtype).reshape(*lead, packed.shape[1])


def int4_matmul_xla_nk(x, packed_t, scale, offset, *, group_size: int, out_dtype=None):
    """x [..., K] @ dequantize_int4(packed_t.T, scale, offset) with packed_t uint8 [N, K/2] (K contiguous): the
    weights are unpacked and dequantized in their own [N, K] orientation and contracted over K on both sides (no
    transpose of the weight). Not measured per op yet: the H200 figures of benchmarks/README.md "int4 on the small-M
    kernel" (8B gate_up: 364-370 us at M = 16, 410 us at M = 256, 1,001 us at M = 2048, against bf16's 81 / 120 /
    767) are of the transposed form int4_matmul_xla(x, packed_t.T, ...), which the benchmark timed by mistake before the review fix;
    the engine's offline int4 figure (0.59x bf16, 73af401) is with this one. Used above the small-M kernel's M and
    under TP, where a tensor-core int4 kernel is still missing."""
    x2, lead = _as_2d(x)
    N, K2 = packed_t.shape
    g = group_size
    p = packed_t.reshape(N, K2 * 2 // g, g // 2)                      # [N, K/g, g/2]: byte i of a group
    u = jnp.stack([p & 0xF, p >> 4], axis=2).astype(x.dtype)          # [N, K/g, 2, g/2]: k = i, g/2 + i
    s = scale.T.astype(x.dtype)[:, :, None, None]                     # [N, K/g, 1, 1]
    o = offset.T.astype(x.dtype)[:, :, None, None]
    w = (u * s + o).reshape(N, K2 * 2)                                 # [N, K] in x.dtype
    y = jax.lax.dot_general(x2, w, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    return y.astype(out_dtype or x.dtype).reshape(*lead, N)


def fp8_matmul_xla(x, q_t, scale, *, out_dtype=None, dot_dtype=None):
    """W8A8 through XLA's native fp8 dot (cuBLASLt on Hopper): e4m3 [M, K] x e4m3 [N, K] contracted over K (f32
    accumulation), then the per-token and per-channel scales multiply the output (cuBLASLt's fused scaling takes
    only scalars, so per-channel scales cannot go inside the GEMM).

    dot_dtype: the dot's output dtype, which the scaling reads back. None: bf16 when the result is bf16 (the
    caller keeps 8 bits of mantissa anyway: one more rounding, relative 2^-9), else f32 (fp16's range cannot hold
    the unscaled e4m3 products' sums). A 2,048-token step's f32 dot outputs are ~11 GB of extra HBM traffic on the
    8B shape (written, then read by the scaling); bf16 made a layer's four projections 930 -> 827 us at M = 2,048
    (H100, 12-07 h, results/kernel-quantized-matmul-fp8out-e7c792b-2026-12-07.json)."""
    out_dtype = jnp.dtype(out_dtype or x.dtype)
    if dot_dtype is None:
        dot_dtype = jnp.bfloat16 if out_dtype == jnp.bfloat16 else jnp.float32
    x2, lead = _as_2d(x)
    if os.environ.get("JAXINFER_FP8_FUSED_QUANT", "1") == "0":
        # An A/B, not yet measured: x written once as it is. Fused (the default), XLA put x's producer into both
        # the row-amax pass and the e4m3 convert, e.g. the down projection's silu(gate) * up computed twice from
        # the gate_up dot's output (2 x 117 MB read a layer at ~1.5 TB/s: 5.8 ms of a 2,048-token step, H100,
        # 12-07 j, results/fp8-fusions-10dde75-2026-12-07.txt); the barrier costs a bf16 write and read of x instead.
        x2 = jax.lax.optimization_barrier(x2)
    xq, xs = quantize_activations_fp8(x2)
    y = jax.lax.dot_general(xq, q_t, (((1,), (1,)), ((), ())), preferred_element_type=dot_dtype)
    y = y.astype(jnp.float32) * xs[:, None] * scale.astype(jnp.float32)[None, :]
    return y.astype(out_dtype).reshape(*lead, q_t.shape[0])
