"""int4 weight-only matmul at decode sizes on Hopper tensor cores (Pallas Mosaic GPU): y = x @ dequantize(q).T.

Shapes: x [M, K] bf16 (M <= MAX_M = 128 tokens, the engine's buckets up to 128), q int4 [N, K] (signed, K
contiguous: the 'native-nk' layout of reference.py, XLA packing two values a byte), scale [K/g, N], offset [K/g, N]
or None (symmetric), g = 128; W[n, k] = q[n, k] * scale[k // g, n] (+ offset[k // g, n]); y [M, N], f32 accumulation.

Why a third design (issue 20): the first two int4 kernels (Pallas-Triton [K/2, N], then Triton / Pallas-Triton
[N, K/2] with CUDA-core unpacking) streamed 0.4-1.8 TB/s of packed bytes at M = 1 against a 2.8 TB/s target: by
operation count they spend ~5-8 integer / FMA instructions a weight. Here the tensor cores do the products and the
unpacking is Mosaic GPU's int4 -> bf16 register conversion (CUTLASS's prmt + lop3 + one bf16x2 subtract: about
1.5 instructions a weight), so the CUDA cores only convert:

  the problem, transposed:  y^T [N, Mp] = W [N, K] @ x^T [K, Mp]   (wgmma m64 nMp k16; Mp = 8 .. 128 token rows,
                                                                    x zero-padded; the weight is the register LHS)
  grid = (N / 64, split):   CTA (n, s) = one warpgroup streaming weight rows [64 n, 64 n + 64) over K groups
                            [s G_s, (s + 1) G_s) through a TMA pipeline (int4 tile [64, g] = 4 KB a stage);
  per group j:              part = q_j (int4 -> bf16 in registers) @ x_j^T   (a fresh [64, Mp] f32 accumulator)
                            acc += part * scale[j, rows] + offset[j, rows] * xs[j, :]   (xs = the group's column
                            sums of x^T, computed outside; so the dequantized weight is never rounded to bf16)
  out [split, N, Mp] f32:   XLA sums the splits (deterministic), transposes and casts.

Measured (H200, jax 0.11.2, 22841b2, results/kernel-quantized-matmul-mosaic-int4-22841b2-2026-12-04.json), µs at
M = 1 with the default config beside the Pallas-Triton int4 kernel (kernel_nk.int4_matmul_nk) and XLA's bf16 dot:
gate_up 36.7 / 54.8 / 76.1, down 31.5 / 35.9 / 39.9, qkv 14.5 / 20.2 / 22.5, o 13.2 / 15.5 / 21.6, lm_head
155.9 / 219.4 / 262.1: 0.6-2.0 TB/s of packed bytes, the fastest int4 form measured but short of 2.8 TB/s.

No interpret mode: Mosaic GPU kernels need the GPU. On CPU the tests check that the kernel traces and lowers for
CUDA (jax.export with platforms=['cuda']) and the wrapper's algebra through a jnp stand-in; the kernel's numbers
against reference.int4_native_matmul_reference are GPU tests (tests/kernels/test_mosaic_int4_gpu.py).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax

GROUP = 128          # the group size the kernel takes (tile_k = one group a pipeline step)
TILE_N = 64          # weight rows a CTA (one warpgroup: wgmma's M)
MAX_M = 128          # token rows the kernel takes (wgmma's N: 8, 16, 32, 64 or 128; a [64, Mp] f32 accumulator
                     # and the group's partial product of the same size stay in registers up to 128)
XS_MIN_WIDTH = 32    # xs rows padded to >= 128 bytes (the pipeline copies whole multiples of the warpgroup size)
TARGET_CTAS = 1024   # split K until the grid has about this many CTAs (~8 resident per SM on 132 SMs)
# ... but half that for long K (>= LONG_K_GROUPS groups): each CTA then streams twice as many groups. The 8B down
# projection (K = 14336, N = 4096) took 21.1 us at M = 1 with 512 CTAs (split 8) against 31.5 with 1024 (split 16),
# 24.4 against 26.8 at M = 16; the shorter-K shapes measured no consistent gain from it (gate_up 36.6 vs 36.7 at
# M = 1, 43.0 vs 38.9 at M = 16; o 11.9 vs 13.2, 21.4 vs 14.7), run-to-run spread ~1-2 us (H200, 22841b2,
# results/kernel-quantized-matmul-mosaic-int4-22841b2-2026-12-04.json, variants int4_mosaic / int4_mosaic_t512).
LONG_K_GROUPS = 64
LONG_K_TARGET_CTAS = 512
# ... and 256 from Mp = 64 tokens on, whatever K: each K split writes a [64, Mp] f32 partial per CTA (XLA sums them
# afterwards), at Mp = 128 as many bytes as the int4 weight it streamed for gate_up's 4 splits. Per layer (gate_up +
# down + qkv + o, H100, 271eefc, results/kernel-quantized-matmul-int4-split-271eefc-2026-12-05.json, us a call):
# M = 64: 144.2 with the targets above, 127.4 with 512, 117.1 with 256, 125.3 with 128 (the bf16 dot 192.3);
# M = 128: 260.4 / 234.8 / 214.4 / 213.9 (bf16 201.5); M = 32: 99.5 / 98.8 / 103.5 / 124.4 (bf16 180.0).
LARGE_M_PADDED = 64
LARGE_M_TARGET_CTAS = 256


@dataclasses.dataclass(frozen=True)
class Config:
    split: int       # K splits (each a whole number of groups)
    stages: int      # pipeline depth (max_concurrent_steps)


def padded_m(M: int) -> int:
    """Token rows of the padded x^T tile (wgmma's N): 8, 16, 32, 64 or 128."""
    mp = 8
    while mp < M:
        mp *= 2
    return mp


def xs_width(mp: int) -> int:
    """Columns of the per-group sums xs: >= Mp and >= 128 bytes."""
    return max(XS_MIN_WIDTH, mp)


def default_config(M: int, K: int, N: int, group_size: int = GROUP, target_ctas: int | None = None,
                   max_stages: int = 4) -> Config:
    """The smallest split of K (a divisor of the group count, >= 2 groups a split) giving >= target_ctas CTAs
    (else the largest such split), and a pipeline of up to max_stages groups. target_ctas None: LARGE_M_TARGET_CTAS
    from LARGE_M_PADDED padded tokens on, else TARGET_CTAS, or LONG_K_TARGET_CTAS for K of LONG_K_GROUPS groups or
    more."""
    groups = K // group_size
    if target_ctas is None:
        if padded_m(M) >= LARGE_M_PADDED:
            target_ctas = LARGE_M_TARGET_CTAS
        else:
            target_ctas = LONG_K_TARGET_CTAS if groups >= LONG_K_GROUPS else TARGET_CTAS
    split = k_split(groups, N // TILE_N, target_ctas)
    return Config(split=split, stages=max(1, min(max_stages, groups // split)))


def k_split(steps: int, tiles: int, target_ctas: int) -> int:
    """The smallest divisor of `steps` (pipeline steps along K) leaving >= 2 steps a split whose grid of
    tiles x split CTAs reaches target_ctas, else the largest such divisor (1 if none)."""
    split = 1
    for cand in range(1, steps + 1):
        if steps % cand or steps // cand < 2:
            continue
        split = cand
        if tiles * cand >= target_ctas:
            break
    return split


def supports(M: int, K: int, N: int, group_size: int | None) -> bool:
    """Whole tiles only: M <= MAX_M, g = 128, N a multiple of 64, K a multiple of g (every 8B projection)."""
    return (0 < M <= MAX_M and group_size == GROUP and N % TILE_N == 0 and K % GROUP == 0 and K >= GROUP)


@functools.lru_cache(maxsize=None)
def _modules():
    try:
        from jax.experimental import pallas as pl
        from jax.experimental.pallas import mosaic_gpu as plgpu
    except ImportError:  # pragma: no cover - a JAX without Pallas Mosaic GPU
        return None
    return pl, plgpu


def usable() -> bool:
    """A Hopper GPU as the default backend and Pallas Mosaic GPU importable (read at trace time)."""
    if jax.default_backend() != "gpu" or _modules() is None:
        return False
    return str(getattr(jax.devices()[0], "compute_capability", "")) == "9.0"


def kernel_inputs(x2, scale, group_size: int = GROUP):
    """x [M, K] -> (x^T's rows padded: x_p bf16 [Mp, K], xs f32 [K/g, xs_width(Mp)] = per-group sums of x_p's rows,
    zero past Mp: a 128-byte row, since the kernel's copies move multiples of 128 bytes)."""
    M, K = x2.shape
    mp = padded_m(M)
    x_p = jnp.pad(x2.astype(jnp.bfloat16), ((0, mp - M), (0, 0)))
    xs = jnp.sum(x_p.astype(jnp.float32).reshape(mp, K // group_size, group_size), axis=2).T
    return x_p, jnp.pad(xs, ((0, 0), (0, xs_width(mp) - mp)))


def _call(x_p, q, scale, offset, xs, *, cfg: Config):
    """The Mosaic GPU kernel: -> part f32 [split, N, Mp]."""
    pl, plgpu = _modules()
    mp, K = x_p.shape
    N = q.shape[0]
    groups = K // GROUP
    gps = groups // cfg.split                      # groups per split
    has_offset = offset is not None
    w_swizzle = plgpu.find_swizzle(GROUP * 4)      # 64 bytes a row of the int4 tile
    x_swizzle = plgpu.find_swizzle(GROUP * 16)     # 256 bytes a row of the bf16 x tile -> 128
    w_transforms = (plgpu.TilingTransform((8, w_swizzle * 8 // 4)), plgpu.SwizzleTransform(w_swizzle))
    x_transforms = (plgpu.TilingTransform((8, x_swizzle * 8 // 16)), plgpu.SwizzleTransform(x_swizzle))
    row_layout = plgpu.Layout.WGMMA.reduce(1)      # a [64] vector over the accumulator's rows
    col_layout = plgpu.Layout.WGMMA.reduce(0)      # a [Mp] vector over its columns

    def body(*refs):
        if has_offset:
            q_g, x_g, s_g, o_g, xs_g, out_g, out_smem = refs
        else:
            q_g, x_g, s_g, xs_g, out_g, out_smem = refs
            o_g = None
        n = lax.axis_index("n")
        sp = lax.axis_index("s")
        rows = pl.ds(n * TILE_N, TILE_N)
        gsl = pl.ds(sp * gps, gps)
        ksl = pl.ds(sp * (gps * GROUP), gps * GROUP)

        def step(_, q_s, x_s, s_s, *rest):
            if has_offset:
                o_s, xs_s, acc = rest
            else:
                xs_s, acc = rest
            w = plgpu.load(q_s, (), layout=plgpu.Layout.WGMMA).astype(jnp.bfloat16)       # [64, g]

            def mma(acc_ref):
                plgpu.wgmma(acc_ref, w, plgpu.transpose_ref(x_s, (1, 0)))                 # x_s [Mp, g]
                return acc_ref[...]

            part = pl.run_scoped(mma, plgpu.ACC((TILE_N, mp), jnp.float32))              # [64, Mp]
            sc = plgpu.load(s_s.at[0], (), layout=row_layout).astype(jnp.float32)         # [64]
            acc = acc + part * lax.broadcast_in_dim(sc, (TILE_N, mp), [0])
            if has_offset:
                of = plgpu.load(o_s.at[0], (), layout=row_layout).astype(jnp.float32)
                xs = plgpu.load(xs_s.at[0, pl.ds(0, mp)], (), layout=col_layout)          # [Mp]
                acc = acc + (lax.broadcast_in_dim(of, (TILE_N, mp), [0])
                             * lax.broadcast_in_dim(xs, (TILE_N, mp), [1]))
            return acc

        in_specs = [plgpu.BlockSpec((TILE_N, GROUP), lambda j: (0, j), transforms=w_transforms),
                    plgpu.BlockSpec((mp, GROUP), lambda j: (0, j), transforms=x_transforms),
                    plgpu.BlockSpec((1, TILE_N), lambda j: (j, 0))]
        operands = [q_g.at[rows, ksl], x_g.at[:, ksl], s_g.at[gsl, rows]]
        if has_offset:
            in_specs.append(plgpu.BlockSpec((1, TILE_N), lambda j: (j, 0)))
            operands.append(o_g.at[gsl, rows])
        in_specs.append(plgpu.BlockSpec((1, xs_width(mp)), lambda j: (j, 0)))
        operands.append(xs_g.at[gsl, :])
        acc0 = plgpu.layout_cast(jnp.zeros((TILE_N, mp), jnp.float32), plgpu.Layout.WGMMA)
        acc = plgpu.emit_pipeline(step, grid=(gps,), in_specs=in_specs, max_concurrent_steps=cfg.stages,
                                  init_carry=acc0)(*operands)
        store_part(out_smem, out_g.at[sp, rows], acc)

    return split_kernel(body, N, mp, cfg)(q, x_p, scale, *((offset,) if has_offset else ()), xs)


def store_part(out_smem, out_ref, value):
    """A CTA's [64, Mp] f32 partial product to its slot of part[split, N, Mp], through shared memory."""
    _, plgpu = _modules()
    out_smem[...] = value
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(out_smem, out_ref)
    plgpu.wait_smem_to_gmem(0)


def split_kernel(body, N: int, mp: int, cfg):
    """The Mosaic GPU kernel over the (N / 64, split) grid writing part f32 [split, N, Mp] (this module's and
    mosaic_int8.py's contract); body(*operands, out, out_smem)."""
    _, plgpu = _modules()
    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((cfg.split, N, mp), jnp.float32),
                        grid=(N // TILE_N, cfg.split), grid_names=("n", "s"),
                        scratch_types=[plgpu.SMEM((TILE_N, mp), jnp.float32)])


def _finish(part, M: int, out_dtype):
    """part f32 [split, N, Mp] -> y [M, N]: the splits summed, transposed, padding rows dropped."""
    return jnp.sum(part, axis=0)[:, :M].T.astype(out_dtype)


def forward(x2, q, scale, offset, *, cfg: Config, out_dtype, call=None):
    """x [M, K] -> y [M, N] around the kernel (`call`, default the Mosaic GPU kernel; the CPU tests pass a jnp
    stand-in of the same contract: (x_p, q, scale, offset, xs, cfg=) -> part f32 [split, N, Mp])."""
    x_p, xs = kernel_inputs(x2, scale)
    part = (call or _call)(x_p, q, scale, offset, xs, cfg=cfg)
    return _finish(part, x2.shape[0], out_dtype)


_int4_mosaic = jax.jit(forward, static_argnames=("cfg", "out_dtype", "call"))


def check_args(name: str, x, q, scale, offset, group_size: int):
    """The int4 [N, K] weight contract of this module's and mosaic_int4_wide.py's wrappers (ValueError naming the
    mismatch); -> (x as [M, K], x's leading shape, (M, K, N))."""
    N, K = q.shape
    if x.shape[-1] != K or q.dtype != jnp.int4 or scale.shape != (K // group_size, N):
        raise ValueError(f"{name} wants x [..., {K}], q int4 [N, K], scale [K/g, N]; got x {x.shape}, "
                         f"q {q.dtype} {q.shape}, scale {scale.shape}, group_size {group_size}")
    if offset is not None and offset.shape != scale.shape:
        raise ValueError(f"offset must be [K/g, N] like scale {scale.shape}, got {offset.shape}")
    x2 = x.reshape(-1, K)
    return x2, x.shape[:-1], (x2.shape[0], K, N)


def int4_matmul_mosaic(x, q, scale, offset=None, *, group_size: int = GROUP, out_dtype=None,
                       cfg: Config | None = None):
    """x [..., K] @ dequantize(q int4 [N, K], scale, offset [K/g, N] or None).T -> [..., N] (module docstring).
    ValueError where the kernel does not take the shape (callers check `supports` first)."""
    x2, lead, (M, K, N) = check_args("int4_matmul_mosaic", x, q, scale, offset, group_size)
    if not supports(M, K, N, group_size):
        raise ValueError(f"the Mosaic int4 kernel takes M <= {MAX_M}, g = {GROUP}, N % {TILE_N} == 0, K % g == 0; "
                         f"got M={M}, K={K}, N={N}, g={group_size}")
    cfg = cfg or default_config(M, K, N, group_size)
    y = _int4_mosaic(x2, q, scale, offset, cfg=cfg, out_dtype=out_dtype or x.dtype)
    return y.reshape(*lead, N)
