"""Small-M int8 matmul on [N, K] (K-contiguous) weights as a Pallas GPU kernel (Triton backend): the engine's
form of the Triton small-M design (triton_small_m.py), which it reproduces block for block.

  x [M, K] bf16 @ (q_t int8 [N, K] * scale f32 [N]).T -> [M, N]

Why a Pallas port of a plain Triton kernel: measured on the H200 (benchmarks/README.md, "Triton small-M
kernels"), the plain Triton kernel streams 3.3 TB/s on gate_up and 4.1 TB/s on the LM head (1.5-1.8x cuBLAS's bf16
GEMV), but called from JAX through jax-triton it made the engine's int8 decode step slower, 5.25 ms against
3.89 ms on XLA alone, the loss growing with the number of calls per step. Our reading (not verified with a
trace): jax-triton emits the legacy `triton_kernel_call` custom call, which XLA does not capture in the step's
command buffer, so every call splits the step's CUDA graph and the step turns host-bound, while Pallas-Triton
lowers to XLA's own Triton custom call. This port made the int8 step 3.17 ms (316.4 tok/s, bf16 232.8).

Work decomposition (as triton_small_m.int8_nk_kernel, DOT form): grid = (N / bn, split, Mp / bm); program
(n, s, m) streams weight rows [n bn, (n + 1) bn) over the K range [s ks, (s + 1) ks) in steps of bk:
  acc[bm, bn] += x[bm, bk] @ q_t[bn, bk].T   (int8 -> bf16 in registers, exact; f32 accumulation; bm = 16 rows,
                                              rows past M are zero padding)
and writes acc * scale to part[s]; XLA sums the split partials (deterministic, no atomics). Shapes the kernel
does not take (`supports`) stay on XLA's convert + dot.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.quantized_matmul.kernel import _TritonCompilerParams
from pallas_kernels.quantized_matmul.triton_small_m import Config, default_config, k_per_split

_HIGHEST = lax.Precision.HIGHEST    # float32 activations (CPU interpret tests): IEEE dots; no effect on bf16


def supports(K: int, N: int, cfg: Config) -> bool:
    """Whole blocks only: N a multiple of block_n, K a multiple of block_k x split_k (every 8B projection)."""
    ks, split = k_per_split(K, cfg)
    return cfg.dot and N % cfg.block_n == 0 and ks * split == K


def _kernel(x_ref, w_ref, s_ref, o_ref, *, bm: int, bn: int, bk: int, ks: int):
    """x_ref [Mp, K], w_ref int8 [N, K], s_ref f32 [N] (whole arrays, indexed here); o_ref: this program's f32
    block [bm, bn] of part[split, Mp, N]."""
    rows = pl.ds(pl.multiple_of(pl.program_id(0) * bn, bn), bn)
    xrows = pl.ds(pl.multiple_of(pl.program_id(2) * bm, bm), bm)
    k_begin = pl.program_id(1) * ks

    def body(i, acc):
        k0 = pl.multiple_of(k_begin + i * bk, bk)
        xb = x_ref[xrows, pl.ds(k0, bk)]                                   # [bm, bk]
        wb = w_ref[rows, pl.ds(k0, bk)].astype(xb.dtype)                   # [bn, bk] int8 -> exact floats
        return acc + lax.dot_general(xb, wb, (((1,), (1,)), ((), ())), precision=_HIGHEST,
                                     preferred_element_type=jnp.float32)

    acc = lax.fori_loop(0, ks // bk, body, jnp.zeros((bm, bn), jnp.float32))
    o_ref[...] = acc * s_ref[rows].astype(jnp.float32)[None, :]


@functools.partial(jax.jit, static_argnames=("cfg", "out_dtype", "interpret"))
def _call(x2, q_t, scale, *, cfg: Config, out_dtype, interpret: bool):
    M, K = x2.shape
    N = q_t.shape[0]
    bm, bn = cfg.block_m, cfg.block_n
    ks, split = k_per_split(K, cfg)
    Mp = -(-M // bm) * bm
    if Mp != M:
        x2 = jnp.pad(x2, ((0, Mp - M), (0, 0)))                              # zero rows, cut below
    params = None
    if not interpret and _TritonCompilerParams is not None:
        params = _TritonCompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    whole = pl.BlockSpec()
    part = pl.pallas_call(
        functools.partial(_kernel, bm=bm, bn=bn, bk=cfg.block_k, ks=ks),
        grid=(N // bn, split, Mp // bm),
        in_specs=[whole, whole, whole],
        out_specs=pl.BlockSpec((None, bm, bn), lambda n, s, m: (s, m, n)),
        out_shape=jax.ShapeDtypeStruct((split, Mp, N), jnp.float32),
        compiler_params=params,
        interpret=interpret,
        name=f"int8_nk_m{bm}_n{bn}_k{cfg.block_k}_s{split}",
    )(x2, q_t, scale.astype(jnp.float32))
    return jnp.sum(part, axis=0)[:M].astype(out_dtype)


def config_for(M: int, K: int, N: int) -> Config:
    """The engine's configuration (triton_small_m.default_config, the H200 sweep's rule)."""
    return default_config("int8", M, K, N)


def int8_matmul_nk(x, q_t, scale, *, out_dtype=None, interpret: bool = False, cfg: Config | None = None):
    """x [..., K] @ (q_t int8 [N, K] * scale [N]).T -> [..., N] in out_dtype (default x.dtype)."""
    if q_t.ndim != 2 or jnp.dtype(q_t.dtype) != jnp.int8:
        raise TypeError(f"q_t must be int8 [N, K], got {q_t.dtype} {tuple(q_t.shape)}")
    N, K = q_t.shape
    if x.shape[-1] != K:
        raise ValueError(f"x must be [..., {K}] (q_t's input dimension), got shape {tuple(x.shape)}")
    x2 = x.reshape(-1, K)
    cfg = cfg or config_for(x2.shape[0], K, N)
    if not supports(K, N, cfg):
        raise ValueError(f"int8 [N, K] kernel needs N % {cfg.block_n} == 0 and K a multiple of block_k x split "
                         f"({cfg.block_k} x {cfg.split_k}) with the tensor-core form, got K={K}, N={N}, {cfg}; "
                         "use the XLA path (convert-nk)")
    y = _call(x2, q_t, scale, cfg=cfg, out_dtype=jnp.dtype(out_dtype or x.dtype), interpret=bool(interpret))
    return y.reshape(*x.shape[:-1], N)
