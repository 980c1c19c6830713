"""Small-M int8 / int4 matmul on K-contiguous weights as Pallas GPU kernels (Triton backend): the engine's form
of the Triton small-M design (triton_small_m.py), which they reproduce block for block.

  int8  x [M, K] bf16 @ (q_t int8 [N, K] * scale f32 [N]).T                       -> [M, N]
  int4  x [M, K] bf16 @ dequantize_int4(p_t uint8 [N, K/2], scale, offset [K/g, N])  -> [M, N]
        (p_t = the transpose of reference.pack_int4's [K/2, N] bytes: group-halves nibble order)

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
                                              rows past M: zero padding, or below 16 rows x's last row repeated)
and writes acc * scale to part[s] (below bm rows only x's M rows: `_store`); XLA sums the split partials
(deterministic, no atomics). Shapes the kernel does not take (`supports`) stay on XLA's convert + dot.

int4 (the engine's GPU int4 default, backend 'triton-int4'; H200 batch-1 decode of the 8B shape 255.9 tok/s against
198.7 on the [K/2, N] Pallas kernel and 233.2 for bf16, batch 16 3,287 vs 3,025 vs 3,404: faster than the old
kernel, still far from int4's bandwidth bound — see benchmarks/README.md "int4 on the small-M kernel"): the bytes are read as int32 words [N, K/8] (a bitcast); per group of g and per byte
position b of a word, the nibble at bit 8b holds k = 4i + b and the one at bit 8b + 4 holds k = g/2 + 4i + b for
word i, so each of the 8 (b, half) planes is a [bn, g/8] block whose activations are a stride-4 slice of x. The
nibble becomes 128 + u as a float by OR-ing its bits into 128.0's (no int -> float conversion), and
W = u s + o = (128 + u) s + (o - 128 s). M = 1: FMAs into a [bn, g/8] f32 accumulator; M > 1 (g = 128 only, the
planes' g/8 = 16 columns being tl.dot's minimum K): 8 tensor-core dots a group on the raw 128 + u values, the
group's scale and offset applied to the [bm, bn] partial.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.quantized_matmul.kernel import _TritonCompilerParams
from pallas_kernels.quantized_matmul.triton_small_m import Config, default_config, int4_kernel_inputs, k_per_split

_HIGHEST = lax.Precision.HIGHEST    # float32 activations (CPU interpret tests): IEEE dots; no effect on bf16


def supports(K: int, N: int, cfg: Config) -> bool:
    """Whole blocks only: N a multiple of block_n, K a multiple of block_k x split_k (every 8B projection)."""
    ks, split = k_per_split(K, cfg)
    return cfg.dot and N % cfg.block_n == 0 and ks * split == K


def _kernel(x_ref, w_ref, s_ref, o_ref, *, bm: int, bn: int, bk: int, ks: int, exact_m: int):
    """x_ref [Mp or M < bm, K], w_ref int8 [N, K], s_ref f32 [N] (whole arrays, indexed here); o_ref: this
    program's f32 block [bm, bn] of part[split, Mp, N], or (exact_m = M < bm) the whole part [split * M, N]."""
    rows = pl.ds(pl.multiple_of(pl.program_id(0) * bn, bn), bn)
    xrows = _x_rows(x_ref.shape[0], bm)
    k_begin = pl.program_id(1) * ks

    def body(i, acc):
        k0 = pl.multiple_of(k_begin + i * bk, bk)
        xb = x_ref[xrows, pl.ds(k0, bk)]                                   # [bm, bk]
        wb = w_ref[rows, pl.ds(k0, bk)].astype(xb.dtype)                   # [bn, bk] int8 -> exact floats
        return acc + lax.dot_general(xb, wb, (((1,), (1,)), ((), ())), precision=_HIGHEST,
                                     preferred_element_type=jnp.float32)

    acc = lax.fori_loop(0, ks // bk, body, jnp.zeros((bm, bn), jnp.float32))
    _store(o_ref, acc * s_ref[rows].astype(jnp.float32)[None, :], xrows, exact_m, rows)


def _x_rows(M: int, bm: int):
    """The x rows program m reads: bm rows from m bm, or, where x has fewer than bm rows (a 1..8-token decode bucket,
    grid m = 1), rows 0..M-1 then row M-1 repeated: an index array, so x needs no padding op before the call (one
    pad fusion per matmul: 65 tiny kernels a step in a 1B draft's 1-token bucket, 129 in the 8B's). The repeated
    rows' outputs land in part's rows >= M, which are cut; they read the same cache lines, no extra HBM traffic."""
    if M < bm:
        return jnp.minimum(lax.broadcasted_iota(jnp.int32, (bm,), 0), M - 1)
    return pl.ds(pl.multiple_of(pl.program_id(2) * bm, bm), bm)


def _store(o_ref, acc, xrows, M: int, cols):
    """Write this program's f32 [bm, bn] partial. M = 0 (blocked output, o_ref [bm, bn]): as it is. M = x's rows,
    below bm (o_ref the whole part [split * M, N], _split_k_call's exact form): row r of acc goes to row
    split_id * M + xrows[r], columns `cols` (the program's bn output columns, the kernel's weight rows), so only M
    rows a split exist. Rows >= M of acc were computed from x's last row, repeated (_x_rows), so they equal row
    M - 1 bit for bit, and their stores to that row write the same value (no mask needed).

    Why: a 1-token decode wrote 16 f32 rows a split where 1 is used. At M = 1 that is ~11 MB of partials a layer
    of the 8B int8 step, written and summed back, beside ~217 MB of weights (~10% more traffic if it reaches HBM
    rather than staying in L2), and ~6.8 MB beside ~61 MB on the 1B draft's layer (~22%), whose int8 kernels ran at
    ~50% of HBM in its step profile (step-profile-draft1b-t1-int8-65dcd08-*). Measured (H100, 12-06 i,
    benchmarks/README.md): per op at M = 1 the 8B projections 1-5% faster, the 1B's qkv / o 15% / 28%; in the
    engine's 8B int8 batch-1 step +0.7% (4.12 -> 4.09 ms); our reading, not profiled: inside the step's CUDA graph
    the partials mostly stay in L2."""
    if not M:
        o_ref[...] = acc
        return
    o_ref[pl.program_id(1) * M + xrows, cols] = acc


def _pad_rows(x2, bm: int):
    """x [M, K] -> [Mp, K], Mp the next multiple of bm (zero rows, cut after); none below bm rows (_x_rows)."""
    M = x2.shape[0]
    Mp = -(-M // bm) * bm
    return x2 if Mp == M or M < bm else jnp.pad(x2, ((0, Mp - M), (0, 0)))


def _split_k_call(kernel, ins, *, cfg: Config, split: int, N: int, M: int, out_dtype, interpret: bool, name: str):
    """Both kernels' launch: grid (N / bn, split, Mp / bm) over whole-array inputs (ins[0] is x, padded to Mp rows
    above bm rows), each program writing its f32 [bm, bn] block of part[split, Mp, N]; XLA sums the splits and cuts
    the rows past M. Below bm rows (cfg.exact_rows) part is [split * M, N], written row by row (_store)."""
    bm, bn = cfg.block_m, cfg.block_n
    Mp = -(-M // bm) * bm
    params = None
    if not interpret and _TritonCompilerParams is not None:
        params = _TritonCompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    exact = M < bm and cfg.exact_rows
    part = pl.pallas_call(
        functools.partial(kernel, exact_m=M if exact else 0),
        grid=(N // bn, split, Mp // bm),
        in_specs=[pl.BlockSpec()] * len(ins),                                  # indexed inside the kernel
        out_specs=pl.BlockSpec() if exact else pl.BlockSpec((None, bm, bn), lambda n, s, m: (s, m, n)),
        out_shape=jax.ShapeDtypeStruct((split * M, N) if exact else (split, Mp, N), jnp.float32),
        compiler_params=params,
        interpret=interpret,
        name=name,
    )(*ins)
    return jnp.sum(part.reshape(split, -1, N), axis=0)[:M].astype(out_dtype)


@functools.partial(jax.jit, static_argnames=("cfg", "out_dtype", "interpret"))
def _call(x2, q_t, scale, *, cfg: Config, out_dtype, interpret: bool):
    M, K = x2.shape
    N = q_t.shape[0]
    ks, split = k_per_split(K, cfg)
    kernel = functools.partial(_kernel, bm=cfg.block_m, bn=cfg.block_n, bk=cfg.block_k, ks=ks)
    return _split_k_call(kernel, (_pad_rows(x2, cfg.block_m), q_t, scale.astype(jnp.float32)), cfg=cfg, split=split,
                         N=N, M=M, out_dtype=out_dtype, interpret=interpret,
                         name=f"int8_nk_m{cfg.block_m}_n{cfg.block_n}_k{cfg.block_k}_s{split}")


def config_for(M: int, K: int, N: int) -> Config:
    """The engine's configuration (triton_small_m.default_config, the H200 sweep's rule)."""
    return default_config("int8", M, K, N)


# Weight dtypes the int8 kernel streams: int8, and fp8 e4m3 (the fp8 model's [N, K] weights, weight-only at small M:
# e4m3 -> bf16 in registers is exact, and Triton converts it natively from SM 8.9).
NK_WEIGHT_DTYPES = (jnp.dtype(jnp.int8), jnp.dtype(jnp.float8_e4m3fn))


def int8_matmul_nk(x, q_t, scale, *, out_dtype=None, interpret: bool = False, cfg: Config | None = None):
    """x [..., K] @ (q_t [N, K] * scale [N]).T -> [..., N] in out_dtype (default x.dtype); q_t int8 or fp8 e4m3
    (NK_WEIGHT_DTYPES)."""
    if q_t.ndim != 2 or jnp.dtype(q_t.dtype) not in NK_WEIGHT_DTYPES:
        raise TypeError(f"q_t must be int8 or float8_e4m3fn [N, K], got {q_t.dtype} {tuple(q_t.shape)}")
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


# ---- int4 ----------------------------------------------------------------------------------------------------------
def _nibble_plane(w, shift: int):
    """int32 words [bn, W4] -> f32 128 + u for the nibble at bit `shift` (moved to bits 16-19, OR-ed into 128.0)."""
    v = lax.shift_left(w, jnp.int32(16 - shift)) if shift <= 16 else lax.shift_right_logical(w, jnp.int32(shift - 16))
    return lax.bitcast_convert_type((v & 0x000F0000) | 0x43000000, jnp.float32)


def _int4_kernel(x_ref, w_ref, s_ref, o_ref, xs_ref, out_ref, *, bm: int, bn: int, g: int, ks: int, dot: bool,
                 exact_m: int):
    """x_ref [Mp or M < bm, K], w_ref int32 [N, K/8], s_ref / o_ref [K/g, N], xs_ref f32 [Mp or M, K/g] (whole
    arrays); out_ref: this program's f32 block [bm, bn] of part[split, Mp, N], or (exact_m = M < bm, the
    tensor-core form) the whole part [split * M, N]."""
    W4, H = g // 8, g // 2
    rows = pl.ds(pl.multiple_of(pl.program_id(0) * bn, bn), bn)
    xrows = _x_rows(x_ref.shape[0], bm)
    k_begin = pl.program_id(1) * ks

    def body(i, acc):
        k0 = pl.multiple_of(k_begin + i * g, g)
        gi = k0 // g
        w = w_ref[rows, pl.ds(pl.multiple_of(k0 // 8, W4), W4)]                     # [bn, W4] int32
        sc = s_ref[gi, rows].astype(jnp.float32)                                     # [bn]
        of = o_ref[gi, rows].astype(jnp.float32) - 128.0 * sc
        if not dot:   # M == 1: acc [bn, W4]
            for b in range(4):
                for half in (0, 1):
                    xv = x_ref[pl.ds(0, 1), pl.ds(k0 + half * H + b, W4, stride=4)].astype(jnp.float32)  # [1, W4]
                    wv = _nibble_plane(w, 8 * b + 4 * half) * sc[:, None] + of[:, None]
                    acc = acc + wv * xv
            return acc
        d = jnp.zeros((bm, bn), jnp.float32)
        for b in range(4):
            for half in (0, 1):
                xv = x_ref[xrows, pl.ds(k0 + half * H + b, W4, stride=4)]                # [bm, W4]
                wv = _nibble_plane(w, 8 * b + 4 * half).astype(xv.dtype)                 # [bn, W4], exact
                d = d + lax.dot_general(xv, wv, (((1,), (1,)), ((), ())), precision=_HIGHEST,
                                        preferred_element_type=jnp.float32)
        xs = xs_ref[xrows, gi]                                                           # [bm]
        return acc + d * sc[None, :] + xs[:, None] * of[None, :]

    if dot:
        acc = lax.fori_loop(0, ks // g, body, jnp.zeros((bm, bn), jnp.float32))
        _store(out_ref, acc, xrows, exact_m, rows)
    else:
        acc = lax.fori_loop(0, ks // g, body, jnp.zeros((bn, W4), jnp.float32))
        out_ref[...] = jnp.sum(acc, axis=1)[None, :]


def int4_supports(M: int, K: int, N: int, group_size: int, cfg: Config) -> bool:
    """Whole blocks (N % block_n, K = split x a whole number of groups); the tensor-core form needs g = 128."""
    return (N % cfg.block_n == 0 and K % (group_size * cfg.split_k) == 0 and K % 8 == 0
            and (not cfg.dot or group_size == 128) and (cfg.dot or M == 1))


def int4_config_for(M: int, K: int, N: int, group_size: int) -> Config:
    return default_config("int4", M, K, N, group_size)


@functools.partial(jax.jit, static_argnames=("cfg", "group_size", "out_dtype", "interpret"))
def _int4_call(x2, p_t, scale, offset, *, cfg: Config, group_size: int, out_dtype, interpret: bool):
    M, K = x2.shape
    N = p_t.shape[0]
    split = cfg.split_k
    x2 = _pad_rows(x2, cfg.block_m)
    words, xs = int4_kernel_inputs(x2, p_t, group_size)                             # [N, K/8], [Mp, K/g]
    kernel = functools.partial(_int4_kernel, bm=cfg.block_m, bn=cfg.block_n, g=group_size, ks=K // split,
                               dot=cfg.dot)
    return _split_k_call(kernel, (x2, words, scale, offset, xs), cfg=cfg, split=split, N=N, M=M,
                         out_dtype=out_dtype, interpret=interpret,
                         name=f"int4_nk_g{group_size}_m{cfg.block_m}_n{cfg.block_n}_s{split}")


def int4_matmul_nk(x, p_t, scale, offset, *, group_size: int, out_dtype=None, interpret: bool = False,
                   cfg: Config | None = None):
    """x [..., K] @ dequantize_int4(p_t.T, scale, offset) -> [..., N]; p_t uint8 [N, K/2], scale/offset [K/g, N]."""
    if p_t.ndim != 2 or jnp.dtype(p_t.dtype) != jnp.uint8:
        raise TypeError(f"p_t must be uint8 [N, K/2], got {p_t.dtype} {tuple(p_t.shape)}")
    N, K = p_t.shape[0], p_t.shape[1] * 2
    if x.shape[-1] != K:
        raise ValueError(f"x must be [..., {K}] (the weight's input dimension), got shape {tuple(x.shape)}")
    x2 = x.reshape(-1, K)
    cfg = cfg or int4_config_for(x2.shape[0], K, N, group_size)
    if not int4_supports(x2.shape[0], K, N, group_size, cfg):
        raise ValueError(f"int4 [N, K/2] kernel does not take M={x2.shape[0]}, K={K}, N={N}, g={group_size} with "
                         f"{cfg} (whole blocks; the tensor-core form needs g = 128); use the XLA path")
    y = _int4_call(x2, p_t, scale, offset, cfg=cfg, group_size=group_size, out_dtype=jnp.dtype(out_dtype or x.dtype),
                   interpret=bool(interpret))
    return y.reshape(*x.shape[:-1], N)
