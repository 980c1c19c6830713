"""Quantized matmul as a Pallas GPU kernel (Triton backend): bf16 activations x int8 (per-channel scales) or
int4 (group-wise scales and offsets, two values a byte) weights, dequantization fused into the K loop.
Same arguments and results as reference.py on the layouts documented there.

Why the Triton backend of Pallas (not Mosaic GPU):
  * `interpret=True` runs this very kernel body on CPU, so it is tested against the reference in CI without a
    GPU (Mosaic GPU kernels cannot run in the interpreter).
  * The op that needs a kernel is the small-M one (decode): a weight-streaming loop whose speed is set by how
    many bytes are in flight, which Triton expresses directly (many programs over N, split-K over K, software
    pipelined loads via num_stages). JAX's Mosaic GPU mixed-type matmul (`hopper_mixed_type_matmul_mgpu`) was
    measured on the H200 and gives no speed-up over XLA's bf16 dot at M <= 256 and needs N % 128 (see
    /work/shared/ANCHORS.md), so it is neither a base nor a peer we can beat by reusing it.
  * The Triton backend is deprecated from JAX 0.11 but still ships in 0.11.x; a Mosaic GPU (wgmma + TMA)
    large-M path is the follow-up if this one loses to XLA at M >= 256 in benchmarks/kernels/quantized_matmul.py.

Work decomposition: grid = (Mp / bm, N / bn, split_k); program (i, j, s) owns output block [bm, bn] and the K
range [s * K / split_k, (s + 1) * K / split_k), walked in steps of bk:
  int8: acc[bm, bn] += x[bm, bk] @ q[bk, bn].astype(x.dtype)         (integers, exact in bf16), f32 accumulation;
        out = acc * scale[bn]                                         (per-channel scale applied once at the end)
  int4: one group (bk = g) per step; the group's packed block [g/2, bn] gives low nibbles (rows 0..g/2) and
        high nibbles (rows g/2..g) of the group (reference.pack_int4), so
        acc += (x_lo @ u_lo + x_hi @ u_hi) * scale[g, bn] + rowsum(x_group)[:, None] * offset[g, bn]
        i.e. the dot runs on the raw nibbles (exact in bf16) and the group's affine dequantization is applied to
        the [bm, bn] partial instead of the [g, bn] weights (cheaper at small M, and no bf16 rounding of
        dequantized weights).
Configurations (`_config`), picked by M at trace time:
  small M (M <= 16, decode): bm = 16 (tl.dot's minimum; rows past M are zero), bn 64-128, split-K so that
        there are >= 2 programs per SM, f32 partials summed by XLA (a few hundred KB, vs MBs of weights);
  medium M (<= 64, batched decode): bm 32/64, same split-K rule;
  large M: bm 64/128, bn 128: a tensor-core tiled GEMM with the dequantization in its K loop (split-K only when
        the output tiles alone cannot give every SM a program, e.g. M = 256 with N = 4096).
All block dims are powers of two >= 16 (Triton tensor sizes and tl.dot operands).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

try:  # Triton backend of Pallas: present in jax 0.4.3x ... 0.11.
    from jax.experimental.pallas import triton as plgpu
except ImportError:  # pragma: no cover
    plgpu = None

# jax 0.10 / 0.11 name it `CompilerParams`; older releases called it `TritonCompilerParams`.
_TritonCompilerParams = None
if plgpu is not None:
    _TritonCompilerParams = getattr(plgpu, "CompilerParams", None) or getattr(plgpu, "TritonCompilerParams", None)

SMALL_M = 16            # M at or below this takes the small-M (weight streaming, split-K) configuration
DEFAULT_NUM_SMS = 132   # H100 / H200; a parameter, because the interpreter has no device to ask
_HIGHEST = lax.Precision.HIGHEST  # float32 activations: IEEE dots (not TF32); no effect on bf16


def _is_pow2(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


def _pow2_divisor(n: int, cap: int) -> int:
    """Largest power of two <= cap dividing n (1 if n is odd)."""
    d = 1
    while d * 2 <= cap and n % (d * 2) == 0:
        d *= 2
    return d


def supports(kind: str, K: int, N: int, group_size: int | None = None) -> bool:
    """Whether the kernel takes a weight of this shape (the engine uses XLA for the others)."""
    if kind == "int8":
        return K % 16 == 0 and N % 16 == 0
    if kind == "int4":
        return group_size in (32, 64, 128) and K % group_size == 0 and N % 16 == 0
    return False


@dataclasses.dataclass(frozen=True)
class Config:
    block_m: int
    block_n: int
    block_k: int       # int4: always the group size
    split_k: int
    num_warps: int
    num_stages: int


def _config(kind: str, M: int, K: int, N: int, group_size: int | None, num_sms: int) -> Config:
    """Default tiles by M (tuned with the --sweep of benchmarks/kernels/quantized_matmul.py at commit 14c54ce):
      M <= 16      bm 16, bn 64 (128 when N alone gives every SM a program; always 128 for int4), int8 bk 256,
                   4 stages
      16 < M <= 64 bm 32 / 64, bn 64-128, int8 bk 128
      64 < M <= 256 bm 64, bn 128, int8 bk 64;   M > 256: bm 128, bn 128, int8 bk 64, 8 warps
    then split-K (power of two, <= 16, whole K steps per split) until there are >= 2 programs per SM (M <= 64:
    the weights must stream from every SM) or >= 1 per SM (larger M, where the f32 partials cost more)."""
    int4 = kind == "int4"
    if M <= SMALL_M:
        bm, bn, bk, warps, stages = 16, (128 if N // 128 >= num_sms else 64), 256, 4, 4
    elif M <= 64:
        bm, bn, bk, warps, stages = (32 if M <= 32 else 64), (128 if N // 128 >= num_sms else 64), 128, 4, 4
    elif M <= 256:
        bm, bn, bk, warps, stages = 64, 128, 64, 4, 3
    else:
        bm, bn, bk, warps, stages = 128, 128, 64, 8, 3
    if int4 and M <= 64:
        bn = 128  # a group step moves only g/2 x bn bytes: wider blocks keep more bytes in flight per program
    bn = _pow2_divisor(N, bn)
    bk = group_size if int4 else _pow2_divisor(K, bk)
    programs = -(-M // bm) * (N // bn)
    want = (2 if M <= 64 else 1) * num_sms
    split = 1
    while programs * split < want and split < 16 and K % (bk * split * 2) == 0:
        split *= 2
    return Config(bm, bn, bk, split, num_warps=warps, num_stages=stages)


# --------------------------------------------------------------------------------------------------------------
# Kernel body
# --------------------------------------------------------------------------------------------------------------
def _qmm_kernel(x_ref, w_ref, s_ref, *refs, kind: str, cfg: Config, k_per_split: int):
    """x_ref [Mp, K]; w_ref int8 [K, N] | uint8 [K/2, N]; s_ref f32 [N] | [K/g, N]; (off_ref [K/g, N]);
    o_ref: this program's output block [bm, bn] (f32 partial when split)."""
    if kind == "int4":
        off_ref, o_ref = refs
    else:
        (o_ref,) = refs
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    rows = pl.ds(pl.multiple_of(pl.program_id(0) * bm, bm), bm)
    cols = pl.ds(pl.multiple_of(pl.program_id(1) * bn, bn), bn)
    k_start = pl.program_id(2) * k_per_split
    steps = k_per_split // bk
    dot = functools.partial(lax.dot_general, dimension_numbers=(((1,), (0,)), ((), ())), precision=_HIGHEST,
                            preferred_element_type=jnp.float32)

    if kind == "int8":
        def body(i, acc):
            k0 = pl.multiple_of(k_start + i * bk, bk)
            xb = x_ref[rows, pl.ds(k0, bk)]                                  # [bm, bk]
            wb = w_ref[pl.ds(k0, bk), cols].astype(xb.dtype)                 # [bk, bn] int8 -> exact floats
            return acc + dot(xb, wb)

        acc = lax.fori_loop(0, steps, body, jnp.zeros((bm, bn), jnp.float32))
        acc = acc * s_ref[cols].astype(jnp.float32)[None, :]
    else:
        h = bk // 2                                                           # packed rows per group

        def body(i, acc):
            gi = k_start // bk + i                                            # group index
            p = w_ref[pl.ds(pl.multiple_of(gi * h, h), h), cols]              # uint8 [g/2, bn]
            x_lo = x_ref[rows, pl.ds(pl.multiple_of(gi * bk, bk), h)]          # [bm, g/2]
            x_hi = x_ref[rows, pl.ds(pl.multiple_of(gi * bk + h, h), h)]
            u_lo = (p & 0xF).astype(x_lo.dtype)                               # [g/2, bn], values 0..15
            u_hi = (p >> 4).astype(x_lo.dtype)
            d = dot(x_lo, u_lo) + dot(x_hi, u_hi)                             # [bm, bn] f32
            xs = jnp.sum(x_lo.astype(jnp.float32), axis=1) + jnp.sum(x_hi.astype(jnp.float32), axis=1)
            sc = s_ref[gi, cols].astype(jnp.float32)                          # [bn]
            of = off_ref[gi, cols].astype(jnp.float32)
            return acc + d * sc[None, :] + xs[:, None] * of[None, :]

        acc = lax.fori_loop(0, steps, body, jnp.zeros((bm, bn), jnp.float32))
    o_ref[...] = acc.astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames=("kind", "cfg", "out_dtype", "interpret"))
def _quantized_matmul(x2, w, scale, offset, *, kind: str, cfg: Config, out_dtype, interpret: bool):
    M, K = x2.shape
    N = w.shape[1]
    bm, bn, S = cfg.block_m, cfg.block_n, cfg.split_k
    Mp = -(-M // bm) * bm
    if Mp != M:
        x2 = jnp.pad(x2, ((0, Mp - M), (0, 0)))                               # zero rows: no effect, cut below
    whole = pl.BlockSpec()                                                     # indexed inside the kernel
    ins = [x2, w, scale] + ([offset] if kind == "int4" else [])
    if S == 1:
        out_shape = jax.ShapeDtypeStruct((Mp, N), out_dtype)
        out_spec = pl.BlockSpec((bm, bn), lambda i, j, s: (i, j))
    else:
        out_shape = jax.ShapeDtypeStruct((S, Mp, N), jnp.float32)
        out_spec = pl.BlockSpec((None, bm, bn), lambda i, j, s: (s, i, j))
    compiler_params = None
    if not interpret and _TritonCompilerParams is not None:
        compiler_params = _TritonCompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    out = pl.pallas_call(
        functools.partial(_qmm_kernel, kind=kind, cfg=cfg, k_per_split=K // S),
        grid=(Mp // bm, N // bn, S),
        in_specs=[whole] * len(ins),
        out_specs=out_spec,
        out_shape=out_shape,
        compiler_params=compiler_params,
        interpret=interpret,
        name=f"{kind}_matmul_m{bm}_n{bn}_k{cfg.block_k}_s{S}",
    )(*ins)
    if S > 1:
        out = jnp.sum(out, axis=0).astype(out_dtype)
    return out[:M]


# --------------------------------------------------------------------------------------------------------------
# Public entry points (validate, pick the configuration)
# --------------------------------------------------------------------------------------------------------------
def _check_x(x, K):
    if x.ndim < 1 or x.shape[-1] != K:
        raise ValueError(f"x must be [..., {K}] (the weight's input dimension), got shape {tuple(x.shape)}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"x must be floating point (bf16 activations), got {x.dtype}")


def _resolve_config(kind, M, K, N, group_size, num_sms, overrides) -> Config:
    cfg = _config(kind, M, K, N, group_size, num_sms)
    cfg = dataclasses.replace(cfg, **{k: v for k, v in overrides.items() if v is not None})
    for name in ("block_m", "block_n", "block_k", "split_k"):
        if not _is_pow2(getattr(cfg, name)):
            raise ValueError(f"{name} must be a power of two, got {getattr(cfg, name)}")
    if min(cfg.block_m, cfg.block_n) < 16 or (kind == "int8" and cfg.block_k < 16):
        raise ValueError(f"block_m, block_n (and int8 block_k) must be >= 16 for tl.dot, got {cfg}")
    if N % cfg.block_n:
        raise ValueError(f"block_n {cfg.block_n} does not divide N={N}")
    if kind == "int4" and cfg.block_k != group_size:
        raise ValueError(f"int4 block_k must equal the group size {group_size}, got {cfg.block_k}")
    if K % (cfg.block_k * cfg.split_k):
        raise ValueError(f"block_k {cfg.block_k} x split_k {cfg.split_k} does not divide K={K}")
    return cfg


def int8_matmul(x, q, scale, *, out_dtype=None, interpret: bool = False, num_sms: int = DEFAULT_NUM_SMS,
                block_m=None, block_n=None, block_k=None, split_k=None, num_warps=None, num_stages=None):
    """x [..., K] (bf16 or f32) @ (q int8 [K, N] * scale f32 [N]) -> [..., N] in out_dtype (default x.dtype).
    Block overrides (powers of two) are for benchmark sweeps; the default picks by M (module docstring)."""
    if q.ndim != 2 or jnp.dtype(q.dtype) != jnp.int8:
        raise TypeError(f"q must be int8 [K, N], got {q.dtype} {tuple(q.shape)}")
    K, N = q.shape
    if tuple(scale.shape) != (N,):
        raise ValueError(f"int8 scale must be [N]=({N},), got {tuple(scale.shape)}")
    _check_x(x, K)
    if not supports("int8", K, N):
        raise ValueError(f"int8 kernel needs K and N multiples of 16, got K={K}, N={N}; use the XLA path")
    x2 = x.reshape(-1, K)
    cfg = _resolve_config("int8", x2.shape[0], K, N, None, num_sms, dict(
        block_m=block_m, block_n=block_n, block_k=block_k, split_k=split_k, num_warps=num_warps,
        num_stages=num_stages))
    _check_backend(interpret)
    y = _quantized_matmul(x2, q, scale, None, kind="int8", cfg=cfg, out_dtype=jnp.dtype(out_dtype or x.dtype),
                          interpret=bool(interpret))
    return y.reshape(*x.shape[:-1], N)


def int4_matmul(x, packed, scale, offset, *, group_size: int, out_dtype=None, interpret: bool = False,
                num_sms: int = DEFAULT_NUM_SMS, block_m=None, block_n=None, split_k=None, num_warps=None,
                num_stages=None):
    """x [..., K] @ dequantize_int4(packed uint8 [K/2, N], scale, offset [K/g, N]) -> [..., N]."""
    if packed.ndim != 2 or jnp.dtype(packed.dtype) != jnp.uint8:
        raise TypeError(f"packed int4 weights must be uint8 [K/2, N], got {packed.dtype} {tuple(packed.shape)}")
    K, N = packed.shape[0] * 2, packed.shape[1]
    if group_size not in (32, 64, 128) or K % group_size:
        raise ValueError(f"int4 group_size must be 32, 64 or 128 and divide K={K}, got {group_size}")
    G = K // group_size
    if tuple(scale.shape) != (G, N) or tuple(offset.shape) != (G, N):
        raise ValueError(f"int4 scale and offset must be [K/g, N]=({G}, {N}), got {tuple(scale.shape)} and "
                         f"{tuple(offset.shape)}")
    _check_x(x, K)
    if not supports("int4", K, N, group_size):
        raise ValueError(f"int4 kernel needs N a multiple of 16, got N={N}; use the XLA path")
    x2 = x.reshape(-1, K)
    cfg = _resolve_config("int4", x2.shape[0], K, N, group_size, num_sms, dict(
        block_m=block_m, block_n=block_n, block_k=None, split_k=split_k, num_warps=num_warps,
        num_stages=num_stages))
    _check_backend(interpret)
    y = _quantized_matmul(x2, packed, scale, offset, kind="int4", cfg=cfg,
                          out_dtype=jnp.dtype(out_dtype or x.dtype), interpret=bool(interpret))
    return y.reshape(*x.shape[:-1], N)


def _check_backend(interpret: bool):
    if not interpret and _TritonCompilerParams is None:
        raise RuntimeError("this jax has no Pallas Triton backend (jax.experimental.pallas.triton); "
                           "use interpret=True or the jnp reference")
