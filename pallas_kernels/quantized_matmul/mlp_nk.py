"""A decode (M <= 16) int8 SwiGLU MLP as one Pallas GPU kernel (Triton backend): gate_up, SiLU x up and down in one
launch instead of three kernels and a fusion.

  x [M, K] bf16, gu_q int8 [2I, K] (rows [gate | up]), gu_s f32 [2I], d_q int8 [H, I], d_s f32 [H]
  y [M, H] = (silu(g) * u) @ (d_q * d_s[:, None]).T,   g | u = x @ (gu_q * gu_s[:, None]).T   (K = H here)

The layouts are the engine's int8 'nk' leaves (QuantLinear with backend 'xla-nk'), unchanged: the unfused path
(kernel_nk.py, M <= 16; XLA above) reads the same arrays.

Work decomposition: grid = (I / bi,). Program p owns the intermediate columns [p bi, (p + 1) bi):
  g, u [bm, bi] = x[bm, K] @ gu_q[rows, K].T * gu_s        (K in steps of bk; int8 -> bf16 in registers, exact)
  h [bm, bi]    = silu(g) * u, rounded to x's dtype as the unfused model rounds gate_up's output and the product
  part[p] [bm, H] = h @ d_q[:, p bi : (p + 1) bi].T * d_s  (H in steps of bn)
and XLA sums the I / bi partials (deterministic, no atomics; f32 [I/bi, M, H]: 1 MB a token on the 1B shape,
written and read back mostly in L2). bm = 16 rows (tl.dot's minimum); x's rows past M are its last row again
(kernel_nk._x_rows: no pad op), and only M rows a partial are stored. Every program streams 3 bi K bytes, so the
~50 MB of a 1B layer's MLP (I = 8192, bi = 64: 128 programs) or ~176 MB of the 8B's (224 programs) stream in one
wave, with no split-K partials of gate_up and no [M, 2I] intermediate in HBM.

Why (issue 21; benchmarks/README.md 2026-12-06 d / g): the 1B int8 draft's step is 2.4x its weight-streaming
floor; at M = 1 its gate_up and down kernels took 23.7 + 12.4 us against an ~17 us floor for their 50 MB, plus
the SiLU fusion and the partial sums, i.e. latency, not bytes. One launch a layer less and one wave over both
matrices is the decomposition measured against them (`benchmarks/kernels/quantized_matmul.py --variants
int8_mlp_*`); the engine takes it only with JAXINFER_FUSED_MLP=1 until that measurement says it wins.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

try:
    from jax.experimental.pallas import triton as plgpu_triton    # atomic_add (the 'atomic' reduction)
except ImportError:  # pragma: no cover
    plgpu_triton = None

from pallas_kernels.quantized_matmul.kernel import _TritonCompilerParams

_HIGHEST = lax.Precision.HIGHEST    # float32 activations (CPU interpret tests): IEEE dots; no effect on bf16
BM = 16                             # tl.dot's minimum rows; M <= BM


def _dot_t(a, b):
    """a [m, k] @ b [n, k].T -> f32 [m, n]."""
    return lax.dot_general(a, b, (((1,), (1,)), ((), ())), precision=_HIGHEST, preferred_element_type=jnp.float32)


def _kernel(x_ref, gu_ref, gus_ref, d_ref, ds_ref, *refs, M: int, I: int, bi: int, bk: int, bn: int, atomic: bool):
    """x_ref [M, K], gu_ref int8 [2I, K], gus_ref f32 [2I], d_ref int8 [H, I], ds_ref f32 [H] (whole arrays);
    o_ref (the last ref) the whole part f32 [I/bi * M, H]: this program writes rows [p M, (p + 1) M); or, atomic,
    y f32 [BM, H] (zeros aliased in), which every program adds its block to (rows >= M are cut after)."""
    o_ref = refs[-1]
    K = x_ref.shape[1]
    H = d_ref.shape[0]
    p = pl.program_id(0)
    i0 = pl.multiple_of(p * bi, bi)
    gate_rows, up_rows = pl.ds(i0, bi), pl.ds(pl.multiple_of(I + i0, bi), bi)
    xrows = jnp.minimum(lax.broadcasted_iota(jnp.int32, (BM,), 0), M - 1)       # [BM]: x's last row repeated

    def gate_up_step(j, carry):
        g, u = carry
        k0 = pl.multiple_of(j * bk, bk)
        xb = x_ref[xrows, pl.ds(k0, bk)]                                            # [BM, bk]
        g = g + _dot_t(xb, gu_ref[gate_rows, pl.ds(k0, bk)].astype(xb.dtype))      # [BM, bi]
        u = u + _dot_t(xb, gu_ref[up_rows, pl.ds(k0, bk)].astype(xb.dtype))
        return g, u

    zeros = jnp.zeros((BM, bi), jnp.float32)
    g, u = lax.fori_loop(0, K // bk, gate_up_step, (zeros, zeros))
    dt = x_ref.dtype
    g = (g * gus_ref[gate_rows][None, :]).astype(dt).astype(jnp.float32)
    u = (u * gus_ref[up_rows][None, :]).astype(dt).astype(jnp.float32)
    h = (g / (1.0 + jnp.exp(-g))).astype(dt).astype(jnp.float32) * u             # silu(gate) * up, model's rounding
    h = h.astype(dt)                                                                # [BM, bi]
    out_rows = p * M + xrows                                                        # rows >= M repeat row M - 1

    def down_step(j, _):
        n0 = pl.multiple_of(j * bn, bn)
        cols = pl.ds(n0, bn)
        y = _dot_t(h, d_ref[cols, gate_rows].astype(dt)) * ds_ref[cols][None, :]    # [BM, bn]
        if atomic:
            plgpu_triton.atomic_add(o_ref, (pl.ds(0, BM), cols), y)                    # rows >= M: cut after
        else:
            o_ref[out_rows, cols] = y
        return 0

    lax.fori_loop(0, H // bn, down_step, 0)


def supports(M: int, K: int, I: int, H: int, *, bi: int = 64, bk: int = 128, bn: int = 64) -> bool:
    """Whole blocks only (every Llama shape of the engine: K, H multiples of 128, I of 64), 1 <= M <= 16."""
    return 1 <= M <= BM and I % bi == 0 and K % bk == 0 and H % bn == 0


@functools.partial(jax.jit, static_argnames=("bi", "bk", "bn", "num_warps", "num_stages", "atomic", "out_dtype",
                                             "interpret"))
def _call(x2, gu_q, gu_s, d_q, d_s, *, bi, bk, bn, num_warps, num_stages, atomic, out_dtype, interpret):
    M = x2.shape[0]
    I, H = d_q.shape[1], d_q.shape[0]
    P = I // bi
    params = None
    if not interpret and _TritonCompilerParams is not None:
        params = _TritonCompilerParams(num_warps=num_warps, num_stages=num_stages)
    ins = [x2, gu_q, gu_s.astype(jnp.float32), d_q, d_s.astype(jnp.float32)]
    if atomic:
        ins.append(jnp.zeros((BM, H), jnp.float32))
    out = pl.pallas_call(
        functools.partial(_kernel, M=M, I=I, bi=bi, bk=bk, bn=bn, atomic=atomic),
        grid=(P,),
        in_specs=[pl.BlockSpec()] * len(ins),                                      # indexed inside the kernel
        out_specs=pl.BlockSpec(),
        out_shape=jax.ShapeDtypeStruct((BM, H) if atomic else (P * M, H), jnp.float32),
        input_output_aliases={5: 0} if atomic else {},
        compiler_params=params,
        interpret=interpret,
        name=f"int8_mlp_nk_i{bi}_k{bk}_n{bn}" + ("_atomic" if atomic else ""),
    )(*ins)
    return (out[:M] if atomic else jnp.sum(out.reshape(P, M, H), axis=0)).astype(out_dtype)


def int8_mlp_nk(x, gu_q, gu_s, d_q, d_s, *, bi: int = 64, bk: int = 128, bn: int = 64, num_warps: int = 4,
                num_stages: int = 3, atomic: bool = False, out_dtype=None, interpret: bool = False):
    """SwiGLU MLP of x [..., K] (M = x.size / K <= 16 tokens) on int8 'nk' weights -> [..., H] in out_dtype
    (default x.dtype). gu_q int8 [2I, K] (gate rows, then up rows), gu_s [2I], d_q int8 [H, I], d_s [H].
    atomic: the programs add into one f32 [16, H] (atomics, summation order not fixed) instead of writing I / bi
    partials for XLA to sum (deterministic, the default)."""
    if jnp.dtype(gu_q.dtype) != jnp.int8 or jnp.dtype(d_q.dtype) != jnp.int8 or gu_q.ndim != 2 or d_q.ndim != 2:
        raise TypeError(f"gu_q / d_q must be 2-D int8, got {gu_q.dtype} {tuple(gu_q.shape)} / "
                        f"{d_q.dtype} {tuple(d_q.shape)}")
    K = x.shape[-1]
    H, I = d_q.shape
    if gu_q.shape != (2 * I, K):
        raise ValueError(f"gu_q must be [2 * {I}, {K}] (gate and up rows for down's {I} inputs over x's {K}), "
                         f"got {tuple(gu_q.shape)}")
    x2 = x.reshape(-1, K)
    if not supports(x2.shape[0], K, I, H, bi=bi, bk=bk, bn=bn):
        raise ValueError(f"fused int8 MLP takes 1..{BM} tokens with I % {bi}, K % {bk}, H % {bn} == 0; got "
                         f"M={x2.shape[0]}, K={K}, I={I}, H={H}; use the unfused path (gate_up, then down)")
    y = _call(x2, gu_q, gu_s, d_q, d_s, bi=bi, bk=bk, bn=bn, num_warps=num_warps, num_stages=num_stages,
              atomic=bool(atomic), out_dtype=jnp.dtype(out_dtype or x.dtype), interpret=bool(interpret))
    return y.reshape(*x.shape[:-1], H)
