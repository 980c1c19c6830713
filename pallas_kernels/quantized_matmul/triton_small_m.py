"""Small-M (decode) weight-streaming quantized matmul: plain Triton kernels, called from JAX through jax-triton.

  int8   x [M, K] bf16 @ (q_t int8 [N, K] * scale f32 [N]).T                -> [M, N]
  int4   x [M, K] bf16 @ dequantize(p_t uint8 [N, K/2], scale, offset [K/g, N]) -> [M, N]
The weights are stored K-contiguous ([out, in], the "nk" layouts of reference.py: int8's q_t is the transpose
of q; int4's p_t is the transpose of the packed [K/2, N] array, with the same group-halves nibble order: within
group j, byte i of the group's g/2 bytes holds k = j*g + i in its low nibble and k = j*g + g/2 + i in its high
nibble). A program's weight tile is then BN rows of BK contiguous bytes: 16-byte vector loads, whole 128-byte
lines, and the activations (a few KB) come from L1 / L2.

Work decomposition: grid = (cdiv(N, BN), SPLIT_K, cdiv(M, BM)). Program (n, s, m) streams weight rows
[n*BN, (n+1)*BN) over the K range [s*KS, (s+1)*KS) (KS = K_PER_SPLIT, a multiple of BK) in steps of BK, and
writes the f32 partial [BM, BN] of that range to part[s]; XLA sums the SPLIT_K partials (a few hundred KB, vs
MBs of weights), so the result is deterministic (no atomics). Two inner forms:
  DOT=True   tensor cores: acc[BM, BN] += x[BM, BK] @ w[BN, BK].T with w converted to bf16 in registers
             (int8 values and int4 nibbles are exact in bf16); int4 applies the group's affine map to the
             [BM, BN] partial of each group: acc += dot(x_g, u_g) * s_g + rowsum(x_g) * o_g (no rounding of
             dequantized weights). BM >= 16 (tl.dot's minimum); rows past M are masked to zero. F32_DOT=True
             makes the dot's operands f32 (IEEE): Triton's CPU interpreter computes bf16 dots wrongly (numpy
             has no bf16), so the CPU tests run the kernels with it; the engine never sets it.
  DOT=False  CUDA cores, M = 1: acc[BN, BK] += w * x (f32 FMAs), one reduction over BK at the end; no tensor-core
             operand shuffles (the weights go register -> FMA, never through shared memory).
Every load of a ragged edge (N % BN, K % BK) is masked; EVEN_K drops the K masks when BK * SPLIT_K divides K.

Why plain Triton (issue 20): it puts the tile shape, vector width and per-program byte count under our control
and is measured alone with torch launches (benchmarks/kernels/triton_small_m.py --part sweep: int8 3.3 TB/s on
gate_up, 4.1 TB/s on the LM head, 1.5-1.8x cuBLAS's bf16 GEMV). The JAX entry points below go through jax-triton;
in the engine that form was slower than XLA (its custom calls appear to split the step's command buffer), so the
engine's int8 path is the Pallas-Triton port of the int8 kernel (kernel_nk.py); the int4 form here is reached only
through the opt-in 'triton-int4' backend. Without triton / jax-triton (CPU machines), `usable()` is False and the
engine uses the other paths; the kernel bodies are tested on CPU under TRITON_INTERPRET=1
(tests/kernels/test_triton_small_m.py). Figures: benchmarks/README.md ("Triton small-M kernels").
"""
from __future__ import annotations

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU machines without triton
    triton = None
    tl = None


def available() -> bool:
    """Whether the kernels can be compiled here (triton importable); the JAX entry points also need jax-triton."""
    return triton is not None


@dataclasses.dataclass(frozen=True)
class Config:
    block_m: int
    block_n: int
    block_k: int        # int4: a multiple of the group size
    split_k: int
    dot: bool
    num_warps: int
    num_stages: int
    # kernel_nk.py below block_m rows: split partials of M rows (True) or of block_m rows, most unused (False, the
    # form before 12-06 i; JAXINFER_NK_EXACT_ROWS=0 restores it for an A/B, read where default_config builds one)
    exact_rows: bool = True


# ----------------------------------------------------------------------------------------------------------------
# Kernel bodies
# ----------------------------------------------------------------------------------------------------------------
if triton is not None:

    @triton.jit
    def int8_nk_kernel(x_ptr, w_ptr, s_ptr, M, N, part_ptr, K: tl.constexpr, K_PER_SPLIT: tl.constexpr,
                       BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, DOT: tl.constexpr,
                       EVEN_K: tl.constexpr, F32_DOT: tl.constexpr):
        """x [M, K] (bf16 / f32), w int8 [N, K], s f32 [N] -> part f32 [SPLIT_K, M, N] (this program's block).
        The output comes after the scalars: jax-triton passes the outputs after all positional arguments."""
        pid_n = tl.program_id(0)
        pid_s = tl.program_id(1)
        pid_m = tl.program_id(2)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        n_ok = rn < N
        k_begin = pid_s * K_PER_SPLIT
        w_rows = w_ptr + rn.to(tl.int64)[:, None] * K                      # [BN, 1] row starts
        if DOT:
            rm = pid_m * BM + tl.arange(0, BM)
            m_ok = rm < M
            x_rows = x_ptr + rm.to(tl.int64)[:, None] * K                  # [BM, 1]
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            for i in range(0, K_PER_SPLIT, BK):
                kk = k_begin + i + rk
                if EVEN_K:
                    w = tl.load(w_rows + kk[None, :], mask=n_ok[:, None], other=0)
                    xb = tl.load(x_rows + kk[None, :], mask=m_ok[:, None], other=0.0)
                else:
                    k_ok = kk < K
                    w = tl.load(w_rows + kk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0)
                    xb = tl.load(x_rows + kk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
                if F32_DOT:
                    acc += tl.dot(xb.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
                else:
                    acc += tl.dot(xb.to(tl.bfloat16), tl.trans(w.to(tl.float32).to(tl.bfloat16)))
            scale = tl.load(s_ptr + rn, mask=n_ok, other=0.0)
            acc = acc * scale[None, :]
            out = part_ptr + pid_s.to(tl.int64) * M * N + rm.to(tl.int64)[:, None] * N + rn[None, :]
            tl.store(out, acc, mask=m_ok[:, None] & n_ok[None, :])
        else:  # M == 1 (BM == 1): FMAs into a [BN, BK] accumulator, one reduction at the end
            acc = tl.zeros((BN, BK), dtype=tl.float32)
            for i in range(0, K_PER_SPLIT, BK):
                kk = k_begin + i + rk
                if EVEN_K:
                    w = tl.load(w_rows + kk[None, :], mask=n_ok[:, None], other=0)
                    xb = tl.load(x_ptr + kk)
                else:
                    k_ok = kk < K
                    w = tl.load(w_rows + kk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0)
                    xb = tl.load(x_ptr + kk, mask=k_ok, other=0.0)
                acc += w.to(tl.float32) * xb.to(tl.float32)[None, :]
            scale = tl.load(s_ptr + rn, mask=n_ok, other=0.0)
            y = tl.sum(acc, axis=1) * scale
            tl.store(part_ptr + pid_s.to(tl.int64) * N + rn, y, mask=n_ok)

    @triton.jit
    def _nibbles_as_f32(w, SHIFT: tl.constexpr):
        """int32 words -> f32 128 + u, u = the nibble at bit SHIFT of each word: the nibble is moved to bits 16-19
        (the units of a float in [128, 256)) and OR-ed into 128.0's bits, so no int -> float conversion runs
        (two integer ops a nibble instead of the slow I2F; the Marlin / FasterTransformer trick)."""
        if SHIFT <= 16:
            v = (w << (16 - SHIFT)) & 0x000F0000
        else:
            v = (w >> (SHIFT - 16)) & 0x000F0000
        return (v | 0x43000000).to(tl.float32, bitcast=True)

    @triton.jit
    def int4_nk_kernel(x_ptr, p_ptr, s_ptr, o_ptr, xs_ptr, M, N, part_ptr, K: tl.constexpr,
                       K_PER_SPLIT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, G: tl.constexpr,
                       DOT: tl.constexpr, F32_DOT: tl.constexpr):
        """x [M, K]; p int32 [N, K/8] (the uint8 [N, K/2] group-halves bytes read as little-endian words: word i of a
        group holds bytes 4i..4i+3, byte b's low nibble is k = 4i + b and its high nibble k = g/2 + 4i + b of
        the group); s / o [K/g, N]; xs f32 [M, K/g] (row sums of x per group, for the offsets) -> part f32
        [SPLIT_K, M, N]. One group per step; the wrapper makes SPLIT_K * K_PER_SPLIT == K (no K masks).
        Dequantized weights are never formed from I2F conversions: f = 128 + u as f32 (_nibbles_as_f32), and
        W = u * s + o = f * s + (o - 128 s)."""
        H: tl.constexpr = G // 2
        W4: tl.constexpr = G // 8                                             # int32 words per row per group
        pid_n = tl.program_id(0)
        pid_s = tl.program_id(1)
        pid_m = tl.program_id(2)
        rn = pid_n * BN + tl.arange(0, BN)
        ri = tl.arange(0, W4)
        n_ok = rn < N
        k_begin = pid_s * K_PER_SPLIT
        p_rows = p_ptr + rn.to(tl.int64)[:, None] * (K // 8)                # [BN, 1]
        if DOT:
            rm = pid_m * BM + tl.arange(0, BM)
            m_ok = rm < M
            x_rows = x_ptr + rm.to(tl.int64)[:, None] * K
            rh = tl.arange(0, H)
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            for i in range(0, K_PER_SPLIT, G):
                k0 = k_begin + i
                w = tl.load(p_rows + (k0 // 8 + ri)[None, :], mask=n_ok[:, None], other=0)     # [BN, W4] int32
                # join appends its new axis last: join(join(b0, b2), join(b1, b3))[n, i, q, p] = byte 2q + p of
                # word i, so the [BN, W4, 2, 2] -> [BN, H] reshape puts byte b of word i at 4i + b: natural k order
                f_lo = tl.reshape(tl.join(tl.join(_nibbles_as_f32(w, 0), _nibbles_as_f32(w, 16)),
                                          tl.join(_nibbles_as_f32(w, 8), _nibbles_as_f32(w, 24))), (BN, H))
                f_hi = tl.reshape(tl.join(tl.join(_nibbles_as_f32(w, 4), _nibbles_as_f32(w, 20)),
                                          tl.join(_nibbles_as_f32(w, 12), _nibbles_as_f32(w, 28))), (BN, H))
                x_lo = tl.load(x_rows + (k0 + rh)[None, :], mask=m_ok[:, None], other=0.0)   # [BM, H]
                x_hi = tl.load(x_rows + (k0 + H + rh)[None, :], mask=m_ok[:, None], other=0.0)
                if F32_DOT:   # 128 + u: exact in bf16 and f32, so the dot is exact up to accumulation order
                    d = (tl.dot(x_lo.to(tl.float32), tl.trans(f_lo), input_precision="ieee")
                         + tl.dot(x_hi.to(tl.float32), tl.trans(f_hi), input_precision="ieee"))
                else:
                    d = (tl.dot(x_lo.to(tl.bfloat16), tl.trans(f_lo.to(tl.bfloat16)))
                         + tl.dot(x_hi.to(tl.bfloat16), tl.trans(f_hi.to(tl.bfloat16))))
                gi = k0 // G
                sc = tl.load(s_ptr + gi * N + rn, mask=n_ok, other=0.0).to(tl.float32)
                of = tl.load(o_ptr + gi * N + rn, mask=n_ok, other=0.0).to(tl.float32) - 128.0 * sc
                xs = tl.load(xs_ptr + rm * (K // G) + gi, mask=m_ok, other=0.0)               # [BM]
                acc += d * sc[None, :] + xs[:, None] * of[None, :]
            out = part_ptr + pid_s.to(tl.int64) * M * N + rm.to(tl.int64)[:, None] * N + rn[None, :]
            tl.store(out, acc, mask=m_ok[:, None] & n_ok[None, :])
        else:  # M == 1: W = f * s + o' in f32, FMAs into a [BN, W4] accumulator per nibble position
            acc = tl.zeros((BN, W4), dtype=tl.float32)
            for i in range(0, K_PER_SPLIT, G):
                k0 = k_begin + i
                w = tl.load(p_rows + (k0 // 8 + ri)[None, :], mask=n_ok[:, None], other=0)     # [BN, W4] int32
                gi = k0 // G
                sc = tl.load(s_ptr + gi * N + rn, mask=n_ok, other=0.0).to(tl.float32)
                of = (tl.load(o_ptr + gi * N + rn, mask=n_ok, other=0.0).to(tl.float32) - 128.0 * sc)[:, None]
                sc = sc[:, None]
                xb = x_ptr + k0 + 4 * ri                                                       # [W4]
                for b in tl.static_range(4):
                    x_lo = tl.load(xb + b).to(tl.float32)[None, :]
                    x_hi = tl.load(xb + H + b).to(tl.float32)[None, :]
                    acc += (_nibbles_as_f32(w, 8 * b) * sc + of) * x_lo
                    acc += (_nibbles_as_f32(w, 8 * b + 4) * sc + of) * x_hi
            tl.store(part_ptr + pid_s.to(tl.int64) * N + rn, tl.sum(acc, axis=1), mask=n_ok)


# ----------------------------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------------------------
DEFAULT_NUM_SMS = 132   # H100 / H200
TARGET_PROGRAMS = 512   # split-K until the grid has about this many programs (~4 per SM on 132 SMs)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def split_for(programs: int, K: int, block_k: int, target: int = TARGET_PROGRAMS, max_split: int = 16) -> int:
    """Power-of-two split-K so that programs * split >= target, keeping >= 2 K steps per split."""
    split = 1
    while programs * split < target and split < max_split and K // (block_k * split * 2) >= 2:
        split *= 2
    return split


def default_config(kind: str, M: int, K: int, N: int, group_size: int | None = None) -> Config:
    """The configuration the engine uses for one call, from the H200 sweep of benchmarks/kernels/triton_small_m.py
    (results/kernel-triton-small-m-sweep-*.json; benchmarks/README.md "Triton small-M kernels"):
      int8, any M <= 16: the tensor-core form (M padded to 16 rows beat the FMA form even at M = 1), BN 64,
            BK 128 (256 when the grid needs no split, e.g. the LM head), 4 warps, 3 stages;
      int4, M = 1: the FMA form, BN 128, 8 warps, 4 stages; M > 1: the tensor-core form, BN 64, 4 warps, 3 stages;
    and split-K (split_for) to ~512 programs: the sweep's best split on every 8B shape within 3%."""
    if kind == "int8":
        bm, bn, dot, warps, stages = 16, 64, True, 4, 3
        bk = 256 if _cdiv(N, bn) * _cdiv(M, bm) >= TARGET_PROGRAMS else 128
        split = split_for(_cdiv(N, bn) * _cdiv(M, bm), K, bk)
    else:
        dot = M > 1
        bm, bn, warps, stages = (16, 64, 4, 3) if dot else (1, 128, 8, 4)
        bk = int(group_size)
        split = int4_split(K, bk, split_for(_cdiv(N, bn) * _cdiv(M, bm), K, bk))
    return Config(bm, bn, bk, split, dot, num_warps=warps, num_stages=stages,
                  exact_rows=os.environ.get("JAXINFER_NK_EXACT_ROWS", "1") != "0")


def k_per_split(K: int, cfg: Config) -> tuple[int, int]:
    """(K range per split, number of splits): whole BK steps per split, so every split starts on a step (and an
    int4 group) boundary; int4 lowers split_k until it divides the K/g groups (no K masks in its kernel)."""
    if cfg.block_k <= 0:
        raise ValueError(f"block_k must be positive, got {cfg}")
    split = max(1, cfg.split_k)
    ks = _cdiv(_cdiv(K, split), cfg.block_k) * cfg.block_k
    return ks, _cdiv(K, ks)


def int4_split(K: int, group_size: int, split_k: int) -> int:
    """The largest split <= split_k that divides K's groups."""
    groups = K // group_size
    split = max(1, min(split_k, groups))
    while groups % split:
        split -= 1
    return split


# ----------------------------------------------------------------------------------------------------------------
# JAX entry points (jax-triton)
# ----------------------------------------------------------------------------------------------------------------
def kernels_enabled() -> bool:
    """The small-M kernels may run here (these and kernel_nk.py's): the default backend a GPU and JAXINFER_TRITON
    not "0" (the escape hatch, and the switch benchmarks use for the XLA peer). Read at trace time."""
    return os.environ.get("JAXINFER_TRITON", "1") != "0" and jax.default_backend() == "gpu"


def usable() -> bool:
    """Whether the JAX entry points below run here: kernels_enabled() and triton + jax-triton importable. Where
    not, the engine's Triton paths fall back to XLA (models/quant_paths.KERNEL_FALLBACK)."""
    return kernels_enabled() and _importable()


@functools.lru_cache(maxsize=None)
def _importable() -> bool:
    if triton is None:
        return False
    try:
        import jax_triton  # noqa: F401
    except ImportError:
        return False
    return True


def _jt():
    try:
        import jax_triton
    except ImportError as e:  # pragma: no cover - only where triton exists without jax-triton
        raise RuntimeError("the Triton small-M kernels need jax-triton (pip install jax-triton); "
                           "use quantized_matmul='xla-nk' or 'auto'") from e
    return jax_triton


def _check_cfg(kind, cfg: Config, M, K, group_size):
    if cfg.dot and cfg.block_m < 16:
        raise ValueError(f"DOT configurations need block_m >= 16 (tl.dot's minimum), got {cfg}")
    if not cfg.dot and (M != 1 or cfg.block_m != 1):
        raise ValueError(f"the FMA form (dot=False) takes M == 1 with block_m 1, got M={M}, {cfg}")
    if kind == "int4" and (cfg.block_k != group_size or K % group_size):
        raise ValueError(f"int4 needs block_k == group_size ({group_size}) dividing K={K}, got {cfg}")


def int4_kernel_inputs(x2, p_t, group_size: int):
    """The int4 kernel's derived inputs: the packed bytes uint8 [N, K/2] read as little-endian int32 words
    [N, K/8] (a bitcast, no copy) and the row sums of x per group f32 [M, K/g] (for the offsets)."""
    M, K = x2.shape
    N = p_t.shape[0]
    words = jax.lax.bitcast_convert_type(p_t.reshape(N, K // 8, 4), jnp.int32)
    xs = jnp.sum(x2.astype(jnp.float32).reshape(M, K // group_size, group_size), axis=2)
    return words, xs


def launch_params(kind: str, M: int, N: int, K: int, cfg: Config, group_size: int | None = None):
    """(grid, number of splits, the kernel's constexpr arguments) of one call: shared by the jax-triton entry
    points below and the CPU tests, which launch the same kernels with torch tensors under TRITON_INTERPRET."""
    if kind == "int8":
        ks, split = k_per_split(K, cfg)
        meta = dict(K=K, K_PER_SPLIT=ks, BM=cfg.block_m, BN=cfg.block_n, BK=cfg.block_k, DOT=cfg.dot,
                    EVEN_K=(K % ks == 0 and ks % cfg.block_k == 0))
    else:
        split = int4_split(K, group_size, cfg.split_k)
        meta = dict(K=K, K_PER_SPLIT=K // split, BM=cfg.block_m, BN=cfg.block_n, G=group_size, DOT=cfg.dot)
    return (_cdiv(N, cfg.block_n), split, _cdiv(M, cfg.block_m)), split, meta


@functools.partial(jax.jit, static_argnames=("cfg", "out_dtype"))
def _int8_call(x2, q_t, scale, *, cfg: Config, out_dtype):
    M, K = x2.shape
    N = q_t.shape[0]
    grid, split, meta = launch_params("int8", M, N, K, cfg)
    part = _jt().triton_call(
        x2, q_t, scale.astype(jnp.float32), M, N, kernel=int8_nk_kernel,
        out_shape=jax.ShapeDtypeStruct((split, M, N), jnp.float32), grid=grid, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, F32_DOT=False, name=f"int8_nk_bn{cfg.block_n}_bk{cfg.block_k}", **meta)
    return jnp.sum(part, axis=0).astype(out_dtype)                         # [M, N]: the splits' partials


@functools.partial(jax.jit, static_argnames=("cfg", "group_size", "out_dtype"))
def _int4_call(x2, p_t, scale, offset, *, cfg: Config, group_size: int, out_dtype):
    M, K = x2.shape
    N = p_t.shape[0]
    grid, split, meta = launch_params("int4", M, N, K, cfg, group_size)
    words, xs = int4_kernel_inputs(x2, p_t, group_size)
    part = _jt().triton_call(
        x2, words, scale, offset, xs, M, N, kernel=int4_nk_kernel,
        out_shape=jax.ShapeDtypeStruct((split, M, N), jnp.float32), grid=grid, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, F32_DOT=False, name=f"int4_nk_g{group_size}_bn{cfg.block_n}", **meta)
    return jnp.sum(part, axis=0).astype(out_dtype)


def int8_matmul_nk(x, q_t, scale, *, out_dtype=None, cfg: Config | None = None):
    """x [..., K] @ (q_t int8 [N, K] * scale [N]).T -> [..., N] (out_dtype default x.dtype)."""
    K = q_t.shape[1]
    if x.shape[-1] != K:
        raise ValueError(f"x must be [..., {K}] (q_t's input dimension), got shape {tuple(x.shape)}")
    x2 = x.reshape(-1, K)
    cfg = cfg or default_config("int8", x2.shape[0], K, q_t.shape[0])
    _check_cfg("int8", cfg, x2.shape[0], K, None)
    y = _int8_call(x2, q_t, scale, cfg=cfg, out_dtype=out_dtype or x.dtype)
    return y.reshape(*x.shape[:-1], q_t.shape[0])


def int4_matmul_nk(x, p_t, scale, offset, *, group_size: int, out_dtype=None, cfg: Config | None = None):
    """x [..., K] @ dequantize_int4(p_t.T, scale, offset) -> [..., N]; p_t uint8 [N, K/2], scale/offset [K/g, N]."""
    K = p_t.shape[1] * 2
    if x.shape[-1] != K:
        raise ValueError(f"x must be [..., {K}] (the weight's input dimension), got shape {tuple(x.shape)}")
    x2 = x.reshape(-1, K)
    cfg = cfg or default_config("int4", x2.shape[0], K, p_t.shape[0], group_size)
    _check_cfg("int4", cfg, x2.shape[0], K, group_size)
    y = _int4_call(x2, p_t, scale, offset, cfg=cfg, group_size=group_size, out_dtype=out_dtype or x.dtype)
    return y.reshape(*x.shape[:-1], p_t.shape[0])
