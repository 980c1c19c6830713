"""int4 weight-only matmul for many tokens (prefill chunks, batch >= 128 decode) on Hopper tensor cores (Pallas
Mosaic GPU): y = x @ dequantize(q).T on the weights of mosaic_int4.py (q int4 [N, K], scale / offset [K/g, N],
g = 128), for M from 1 to any size. The same kernel takes int8 [N, K] weights with per-channel scales
(int8_matmul_mosaic_wide: int8 -> bf16 is exact, the f32 scale multiplies the accumulator at the end, as XLA's
convert + dot does; not yet run on a GPU, no engine path).

Why a second int4 kernel (issue 20, "large M never slower than bf16"): mosaic_int4.py keeps a fresh [64, Mp] f32
accumulator per group of 128 and adds it, scaled, into a running one. That epilogue (Mp / 2 FMAs a thread a group,
after waiting for the group's MMA) and the two register accumulators cap it at 128 tokens, and at 128 it already
trails the bf16 dot (per layer 214 vs 201.5 us, H100); above 128 the engine fell back to XLA's dequantize + dot,
which writes and re-reads the whole bf16 weight (0.4-0.8x the bf16 dot per op). Here the scale (and offset) is
applied to the weight tile in registers before the MMA (one bf16 multiply(-add) a weight, amortised over the
tile's tokens), so one accumulator takes the CTA's whole K range and the MMAs need no per-group epilogue:

  the problem, transposed:  y^T [N, M] = W [N, K] @ x^T [K, M]        (wgmma m64 nTM k16, the weight the register
                                                                       LHS, TM = tile_m tokens: 8 .. 256)
  grid = (N / (64 rb), M_pad / TM, split):
                            CTA (n, m, s) = one warpgroup, rb row blocks of 64 weight rows sharing each staged x
                            tile (rb = 2 halves the x tile's re-reads from L2: every CTA of a token tile reads it;
                            rb = 1 where 2 would leave too few CTAs),
                            over K groups [s G_s, (s + 1) G_s) through a TMA pipeline (int4 [64 rb, g], x [TM, g])
  per group j, row block r: w = bf16(q_j,r) * scale[j, r] (+ offset[j, r])   (one rounding of the dequantized
                            weight to bf16, as XLA's dequantize + dot does)
                            acc_r += w @ x_j^T                                 ([64, TM] f32, in registers)
  out:                      split == 1: y^T [N, M_pad] in the output dtype (no f32 partials, no XLA sum); else
                            part f32 [split, N, M_pad], summed by XLA; XLA transposes. transpose_out (the default
                            since 2026-12-05 d): each [64, TM] accumulator transposed in registers and stored as y
                            [TM, 64], so the kernel writes y [M_pad, N] / part [split, M_pad, N] itself.

Numerics: against the float32 reference of the same quantized weights the only extra error is the bf16 rounding
of each dequantized weight (relative 2^-9) and of the activations; tests bound it (tests/kernels/
test_mosaic_int4_wide*.py). No interpret mode: the CPU tests check that it traces and lowers for CUDA and the
wrapper's algebra through a jnp stand-in; the numbers are GPU tests.

Measured (H100, jax 0.11.2, fc17463, results/kernel-quantized-matmul-int4-wide-fc17463-2026-12-05.json, the 8B
layer's four projections summed, us; this kernel / XLA's dequantize + dot / the bf16 dot): M = 256 273 / 558 / 284,
M = 512 506 / 685 / 422, M = 2048 1,546 / 1,661 / 1,449. So the engine runs it above 128 tokens (models/
quant_paths.py; above 16 since 2026-12-05 d, where it also beat mosaic_int4.py at 32-128 tokens), but from ~512
tokens it is still 0.83-0.94x the bf16 dot: one warpgroup a CTA waits for its MMAs
each group, where the bf16 GEMM runs warp-specialised producer / consumer warpgroups. Variants measured and
dropped: MMAs kept in flight across groups (3 stages, one CTA an SM: won 3 of 12 cells at one row block, lost every
M = 2048 cell; on the H100 of 2026-12-05 d one such config gave NaN, so the option is gone), 64-token tiles (lost
everywhere).

The in-kernel transpose (transpose_out, 2026-12-05 d; H200, jax 0.11.2, 2b5cd52, results/quantized-decode-int4-wide-
tout-2b5cd52-2026-12-05.json, 8B, int4 / bf16 in one process): batch-256 decode 14,893 tok/s against 14,121 with
XLA's transposes (bf16 16,733: 0.89x against 0.84x), offline 384 x 512/128 5,400 against 5,095 output tok/s (bf16
6,190: 0.87x against 0.82x); its GPU tests passed (results/gpu-tests-mosaic-int4-wide-2b5cd52-2026-12-05.json).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax

from pallas_kernels.quantized_matmul.mosaic_int4 import (GROUP, TILE_N, _modules, check_args, k_split,  # noqa: F401
                                                         padded_m, usable)

MAX_TILE_M = 128     # tokens a CTA by default: x [128, g] bf16 = 32 KB a stage leaves room for 4 stages at 2 row
                     # blocks; 256 (wgmma's largest N, a [64, 256] f32 accumulator = 128 registers a thread) fits
                     # only 2 stages (benchmarks sweep both)
TARGET_CTAS = 264    # split K only while the (N / 64 rb) x (M / TM) grid has fewer CTAs than ~2 waves of 132 SMs
# Shared memory a CTA may fill with its staged tiles and output tile: <= 112 KB keeps two CTAs on an SM (227 KB),
# so one CTA's dequantization runs while the other's MMAs do. H100, fb8401c, gate_up at M = 2048: 2 stages (112 KB)
# 821 us, 4 stages (176 KB, one CTA an SM) 1,074 us, the bf16 dot 761, XLA's dequantize + dot 896
# (results/kernel-quantized-matmul-int4-wide-fb8401c-2026-12-05.json).
SMEM_BYTES = 112 * 1024
# default_config's transpose_out (WideConfig.transpose_out); benchmarks/quantized_decode.py's "@yt" / "@tout"
# methods set it in-process for an A/B.
TRANSPOSE_OUT = True


@dataclasses.dataclass(frozen=True)
class WideConfig:
    tile_m: int      # tokens a CTA (wgmma's N): 8 .. 256, a power of two
    row_blocks: int  # 64-row weight blocks a CTA (1 or 2), sharing each staged x tile
    split: int       # K splits (each a whole number of groups)
    stages: int      # pipeline depth
    transpose_out: bool = True   # write y [M, N] (the tile relaid to WGMMA_TRANSPOSED in registers, one shuffle +
                                 # permute a register, stored through a transposed view of shared memory) instead of
                                 # y^T [N, M] for XLA to transpose: those transposes took 1.7 ms of int4's 17.6 ms
                                 # batch-256 decode step (H100, 4de35df, results/step-profile-decode-b256-int4-
                                 # 4de35df-2026-12-05.log); measured in the module docstring


def tile_m_for(M: int, max_tile_m: int = MAX_TILE_M) -> int:
    return min(padded_m(M) if M <= 128 else 1 << (M - 1).bit_length(), max_tile_m)


def stage_bytes(tile_m: int, row_blocks: int, weight_bits: int = 4) -> int:
    """Shared memory of one pipeline stage: x [TM, g] bf16 + q [64 rb, g] int4 (int8) + scale / offset rows."""
    return tile_m * GROUP * 2 + TILE_N * row_blocks * GROUP * weight_bits // 8 + 2 * 4 * TILE_N * row_blocks


def default_config(M: int, K: int, N: int, *, max_tile_m: int = MAX_TILE_M, row_blocks: int | None = None,
                   target_ctas: int = TARGET_CTAS, max_stages: int = 4, smem_bytes: int = SMEM_BYTES,
                   weight_bits: int = 4) -> WideConfig:
    """TM = the padded token count up to max_tile_m; 2 row blocks where the grid then still has >= target_ctas CTAs
    without a K split (else 1: more CTAs beat fewer x re-reads); K split until the grid reaches target_ctas (>= 2
    groups a split); as many stages (<= max_stages) as fit smem_bytes beside the output tile, but >= 2;
    transpose_out = TRANSPOSE_OUT.

    The row-block rule picked the faster of 1 and 2 on all 12 measured (shape, M) cells (H100, fc17463: the 8B
    gate_up / down / qkv / o at M = 256 / 512 / 2048), e.g. M = 256: gate_up 131.1 us with 2 (148.1 with 1), down
    72.8 with 1 (99.5 with 2); M = 2048: 2 on every shape (gate_up 845 vs 1,147)."""
    tm = tile_m_for(M, max_tile_m)
    m_tiles = -(-M // tm)
    if row_blocks is None:
        wide_grid = N % (2 * TILE_N) == 0 and (N // (2 * TILE_N)) * m_tiles >= target_ctas
        row_blocks = 2 if wide_grid else 1
    rb = row_blocks
    tiles = (N // (TILE_N * rb)) * m_tiles
    groups = K // GROUP
    split = k_split(groups, tiles, target_ctas)
    out_bytes = TILE_N * tm * (2 if split == 1 else 4)     # the output tile: bf16 y^T or an f32 partial
    fit = max(1, (smem_bytes - out_bytes) // stage_bytes(tm, rb, weight_bits))
    # at least 2 stages (one load in flight) where the split has 2 groups, even past smem_bytes (one CTA an SM)
    stages = max(min(2, max_stages, groups // split), min(max_stages, fit, groups // split))
    return WideConfig(tile_m=tm, row_blocks=rb, split=split, stages=stages, transpose_out=TRANSPOSE_OUT)


def supports(M: int, K: int, N: int, group_size: int | None) -> bool:
    """Whole weight tiles only: g = 128, N a multiple of 64, K a multiple of g (every 8B projection); any M >= 1."""
    return M > 0 and group_size == GROUP and N % TILE_N == 0 and K % GROUP == 0 and K >= GROUP


def _call(x_p, q, scale, offset, *, cfg: WideConfig, out_dtype):
    """The Mosaic GPU kernel: x_p bf16 [M_pad, K] (M_pad a multiple of TM) -> y [M_pad, N] in out_dtype (split 1)
    or part f32 [split, M_pad, N] (transpose_out; else y^T [N, M_pad] / part [split, N, M_pad])."""
    pl, plgpu = _modules()
    m_pad, K = x_p.shape
    N = q.shape[0]
    tm, rb = cfg.tile_m, cfg.row_blocks
    tn = TILE_N * rb
    gps = K // GROUP // cfg.split                  # groups (K steps of 128) per split
    has_offset = offset is not None
    per_channel = q.dtype == jnp.int8              # int8: scale [1, N], the same for every K step
    wbits = 8 if per_channel else 4
    part_dtype = out_dtype if cfg.split == 1 else jnp.float32
    w_swizzle = plgpu.find_swizzle(GROUP * wbits)  # 64 (int4) / 128 (int8) bytes a row of the weight tile
    x_swizzle = plgpu.find_swizzle(GROUP * 16)     # 256 bytes a row of the bf16 x tile -> 128
    w_transforms = (plgpu.TilingTransform((8, w_swizzle * 8 // wbits)), plgpu.SwizzleTransform(w_swizzle))
    x_transforms = (plgpu.TilingTransform((8, x_swizzle * 8 // 16)), plgpu.SwizzleTransform(x_swizzle))
    row_layout = plgpu.Layout.WGMMA.reduce(1)      # a [64] vector over a weight tile's rows

    def body(*refs):
        if has_offset:
            q_g, x_g, s_g, o_g, out_g, out_smem = refs
        else:
            q_g, x_g, s_g, out_g, out_smem = refs
            o_g = None
        n = lax.axis_index("n")
        m = lax.axis_index("m")
        sp = lax.axis_index("s")
        rows = pl.ds(n * tn, tn)
        toks = pl.ds(m * tm, tm)
        gsl = pl.ds(sp * gps, gps)
        ksl = pl.ds(sp * (gps * GROUP), gps * GROUP)

        def run(*accs):
            def step(_, q_s, x_s, s_s, *rest):
                o_s = rest[0] if has_offset else None
                xt = plgpu.transpose_ref(x_s, (1, 0))                                    # x_s [TM, 128]
                scales = []
                for r in range(rb):
                    blk = pl.ds(r * TILE_N, TILE_N)
                    w = plgpu.load(q_s.at[blk], (), layout=plgpu.Layout.WGMMA).astype(jnp.bfloat16)   # [64, 128]
                    sc = plgpu.load(s_s.at[0, blk], (), layout=row_layout)                             # [64]
                    if per_channel:   # int8: exact in bf16; the f32 scale multiplies the accumulator at the end
                        scales.append(sc.astype(jnp.float32))
                    else:             # int4: the group's scale (+ offset) on the tile, one bf16 rounding a weight
                        w = w * lax.broadcast_in_dim(sc.astype(jnp.bfloat16), (TILE_N, GROUP), [0])
                        if has_offset:
                            of = plgpu.load(o_s.at[0, blk], (), layout=row_layout).astype(jnp.bfloat16)
                            w = w + lax.broadcast_in_dim(of, (TILE_N, GROUP), [0])
                    plgpu.wgmma(accs[r], w, xt)
                # the MMAs read x_s from shared memory asynchronously: done before the pipeline refills the slot
                plgpu.wgmma_wait(0)
                return tuple(scales) if per_channel else None

            in_specs = [plgpu.BlockSpec((tn, GROUP), lambda j: (0, j), transforms=w_transforms),
                        plgpu.BlockSpec((tm, GROUP), lambda j: (0, j), transforms=x_transforms),
                        plgpu.BlockSpec((1, tn), (lambda j: (0, 0)) if per_channel else (lambda j: (j, 0)))]
            operands = [q_g.at[rows, ksl], x_g.at[toks, ksl], s_g.at[:, rows] if per_channel else s_g.at[gsl, rows]]
            if has_offset:
                in_specs.append(plgpu.BlockSpec((1, tn), lambda j: (j, 0)))
                operands.append(o_g.at[gsl, rows])
            carry0 = (tuple(plgpu.layout_cast(jnp.zeros((TILE_N,), jnp.float32), row_layout) for _ in range(rb))
                      if per_channel else None)
            scales = plgpu.emit_pipeline(step, grid=(gps,), in_specs=in_specs, max_concurrent_steps=cfg.stages,
                                         init_carry=carry0)(*operands)
            plgpu.wgmma_wait(0)
            dst = out_g if cfg.split == 1 else out_g.at[sp]
            for r in range(rb):
                acc = accs[r][...]
                if per_channel:
                    acc = acc * lax.broadcast_in_dim(scales[r], (TILE_N, tm), [0])
                if cfg.transpose_out:   # the [64, TM] tile transposed in registers: smem holds y [TM, 64]
                    val = plgpu.layout_cast(acc.astype(part_dtype), plgpu.Layout.WGMMA_TRANSPOSED)
                    # (in WGMMA_TRANSPOSED each lane holds column pairs, the vector run a transposed store needs)
                    # (.at[:, :]: a transformed ref, which jax 0.11's transpose_ref needs; a plain scratch ref fails)
                    plgpu.transpose_ref(out_smem.at[:, :], (1, 0))[...] = val
                    plgpu.commit_smem()
                    plgpu.copy_smem_to_gmem(out_smem, dst.at[toks, pl.ds(n * tn + r * TILE_N, TILE_N)])
                else:
                    out_smem[...] = acc.astype(part_dtype)
                    plgpu.commit_smem()
                    plgpu.copy_smem_to_gmem(out_smem, dst.at[pl.ds(n * tn + r * TILE_N, TILE_N), toks])
                plgpu.wait_smem_to_gmem(0)

        pl.run_scoped(run, *[plgpu.ACC((TILE_N, tm), jnp.float32) for _ in range(rb)])

    out_shape = (m_pad, N) if cfg.transpose_out else (N, m_pad)
    out_shape = out_shape if cfg.split == 1 else (cfg.split, *out_shape)
    tile = (tm, TILE_N) if cfg.transpose_out else (TILE_N, tm)
    kernel = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(out_shape, part_dtype),
                          grid=(N // tn, m_pad // tm, cfg.split), grid_names=("n", "m", "s"),
                          scratch_types=[plgpu.SMEM(tile, part_dtype)])
    return kernel(q, x_p, scale, *((offset,) if has_offset else ()))


def forward(x2, q, scale, offset, *, cfg: WideConfig, out_dtype, call=None):
    """x [M, K] -> y [M, N] around the kernel (`call`, default the Mosaic GPU kernel; the CPU tests pass a jnp
    stand-in of the same contract: (x_p, q, scale, offset, cfg=, out_dtype=) -> _call's output)."""
    M = x2.shape[0]
    m_pad = -(-M // cfg.tile_m) * cfg.tile_m
    x_p = jnp.pad(x2.astype(jnp.bfloat16), ((0, m_pad - M), (0, 0)))
    out = (call or _call)(x_p, q, scale, offset, cfg=cfg, out_dtype=out_dtype)
    if cfg.split > 1:
        out = jnp.sum(out, axis=0)
    return (out[:M] if cfg.transpose_out else out[:, :M].T).astype(out_dtype)


_wide_jit = jax.jit(forward, static_argnames=("cfg", "out_dtype", "call"))


def int4_matmul_mosaic_wide(x, q, scale, offset=None, *, group_size: int = GROUP, out_dtype=None,
                            cfg: WideConfig | None = None):
    """x [..., K] @ dequantize(q int4 [N, K], scale, offset [K/g, N] or None).T -> [..., N] (module docstring).
    ValueError where the kernel does not take the shape (callers check `supports` first)."""
    x2, lead, (M, K, N) = check_args("int4_matmul_mosaic_wide", x, q, scale, offset, group_size)
    if not supports(M, K, N, group_size):
        raise ValueError(f"the wide Mosaic int4 kernel takes g = {GROUP}, N % {TILE_N} == 0, K % g == 0, M >= 1; "
                         f"got M={M}, K={K}, N={N}, g={group_size}")
    cfg = cfg or default_config(M, K, N)
    y = _wide_jit(x2, q, scale, offset, cfg=cfg, out_dtype=out_dtype or x.dtype)
    return y.reshape(*lead, N)


def int8_supports(M: int, K: int, N: int) -> bool:
    """int8 [N, K] weights: N a multiple of 64, K a multiple of 128 (every 8B projection); any M >= 1."""
    return M > 0 and N % TILE_N == 0 and K % GROUP == 0 and K >= GROUP


def int8_matmul_mosaic_wide(x, q, scale, *, out_dtype=None, cfg: WideConfig | None = None):
    """x [..., K] @ (q int8 [N, K] * scale [N]).T -> [..., N]: the same kernel with per-channel scales (int8 -> bf16
    exact, the f32 scale on the f32 accumulator; the 'nk' int8 layout of 'xla-nk'). Not yet run on a GPU
    (2026-12-05 c); no engine path takes it. ValueError where the kernel does not take the shape."""
    N, K = q.shape
    if x.shape[-1] != K or q.dtype != jnp.int8 or scale.shape != (N,):
        raise ValueError(f"int8_matmul_mosaic_wide wants x [..., {K}], q int8 [N, K], scale [N]; got x {x.shape}, "
                         f"q {q.dtype} {q.shape}, scale {scale.shape}")
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    if not int8_supports(M, K, N):
        raise ValueError(f"the wide Mosaic int8 kernel takes N % {TILE_N} == 0, K % {GROUP} == 0, M >= 1; got "
                         f"M={M}, K={K}, N={N}")
    cfg = cfg or default_config(M, K, N, weight_bits=8)
    y = _wide_jit(x2, q, scale.reshape(1, N), None, cfg=cfg, out_dtype=out_dtype or x.dtype)
    return y.reshape(*x.shape[:-1], N)
