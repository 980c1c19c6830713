"""int8 weight-only matmul at decode sizes on Hopper tensor cores (Pallas Mosaic GPU): y = x @ (q * scale).T.

Shapes: x [M, K] bf16 (M <= MAX_M = 128 tokens), q int8 [N, K] (K contiguous: the 'nk' layout of the int8 default
'xla-nk'), scale f32 [N] (per output channel); y [M, N], f32 accumulation.

Why (issue 20): the int8 small-M kernel the engine runs (kernel_nk.int8_matmul_nk, Pallas-Triton: int8 -> bf16 on
the CUDA cores, mma.sync) streams 3.3-4.1 TB/s on the large 8B weights but less on the small ones, and the int8
batch-1 step stayed at 1.21-1.36x bf16 against a 1.6x target over three rounds of tuning. This is the other design,
the one that gave int4 its 1.27x (mosaic_int4.py): the weight tile as wgmma's register operand, converted
int8 -> bf16 in registers, the tokens as the small N of the MMA. Per-channel scales make it simpler than int4's:
no per-group epilogue, the products of a CTA's whole K range accumulate in one wgmma accumulator, and the scale is
applied once, outside the kernel (with the split sum, by XLA):

  the problem, transposed:  part[s] [N, Mp] = q [N, K_s] @ x^T [K_s, Mp]   (wgmma m64 nMp k16, Mp = 8 .. 128)
  grid = (N / 64, split):   CTA (n, s) = one warpgroup streaming weight rows [64 n, 64 n + 64) over its K range in
                            TILE_K = 128 steps through a TMA pipeline (int8 tile [64, 128] = 8 KB a stage)
  y = (sum_s part[s])^T * scale                                               (XLA: deterministic split sum)

Status (2026-12-05): traces and lowers for CUDA (tests/kernels/test_mosaic_int8.py on the CPU, with the wrapper's
algebra against the float32 reference through a jnp stand-in of the kernel); on an H100 (29a3906,
benchmarks/gpu_followup_1205.sh PART=c) its GPU tests pass (tests/kernels/test_mosaic_int8_gpu.py, 14 run), but it
ties or trails the Pallas-Triton kernel per op (M = 1: gate_up 57.7 vs 57.5 us, lm_head 216 vs 204; slower on every
shape at M = 16) and in the engine (batch 1 225.8 vs 250.7 tok/s, batch 16 3,093 vs 3,817;
results/quantized-decode-mosaic-int8-2026-12-05.json). So only the opt-in backend quantized_matmul='mosaic-int8'
runs it (models/quant_paths.py).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

# the int4 kernel's tile, token limit, padding, config (split: K splits of whole TILE_K steps), split rule and
# part[split, N, Mp] output (usable: re-exported)
from pallas_kernels.quantized_matmul.mosaic_int4 import (MAX_M, TARGET_CTAS, TILE_N, Config, _modules,  # noqa: F401
                                                         k_split, padded_m, split_kernel, store_part, usable)

TILE_K = 128         # K elements a pipeline step (128 bytes of int8 a row: one 128-byte swizzle)


def default_config(M: int, K: int, N: int, target_ctas: int = TARGET_CTAS, max_stages: int = 4) -> Config:
    """The smallest split of K (a divisor of the step count, >= 2 steps a split) giving >= target_ctas CTAs (else the
    largest such split), and a pipeline of up to max_stages steps."""
    steps = K // TILE_K
    split = k_split(steps, N // TILE_N, target_ctas)
    return Config(split=split, stages=max(1, min(max_stages, steps // split)))


def supports(M: int, K: int, N: int) -> bool:
    """Whole tiles only: M <= MAX_M, N a multiple of 64, K a multiple of 128 (every 8B projection)."""
    return 0 < M <= MAX_M and N % TILE_N == 0 and K % TILE_K == 0 and K >= TILE_K


def _call(x_p, q, *, cfg: Config):
    """The Mosaic GPU kernel: x_p bf16 [Mp, K], q int8 [N, K] -> part f32 [split, N, Mp] (unscaled)."""
    pl, plgpu = _modules()
    mp, K = x_p.shape
    N = q.shape[0]
    sps = K // TILE_K // cfg.split                 # pipeline steps per split
    w_swizzle = plgpu.find_swizzle(TILE_K * 8)     # 128 bytes a row of the int8 tile
    x_swizzle = plgpu.find_swizzle(TILE_K * 16)    # 256 bytes a row of the bf16 x tile -> 128
    w_transforms = (plgpu.TilingTransform((8, w_swizzle)), plgpu.SwizzleTransform(w_swizzle))
    x_transforms = (plgpu.TilingTransform((8, x_swizzle * 8 // 16)), plgpu.SwizzleTransform(x_swizzle))

    def body(q_g, x_g, out_g, out_smem):
        n = lax.axis_index("n")
        sp = lax.axis_index("s")
        rows = pl.ds(n * TILE_N, TILE_N)
        ksl = pl.ds(sp * (sps * TILE_K), sps * TILE_K)

        def run(acc_ref):
            def step(_, q_s, x_s):
                w = plgpu.load(q_s, (), layout=plgpu.Layout.WGMMA).astype(jnp.bfloat16)   # [64, TILE_K]
                plgpu.wgmma(acc_ref, w, plgpu.transpose_ref(x_s, (1, 0)))                 # x_s [Mp, TILE_K]
                # the MMA reads x_s from shared memory asynchronously: done before the pipeline refills the slot
                # (the weight went to registers above). A tiny MMA; the TMA loads of later steps stay in flight.
                plgpu.wgmma_wait(0)

            in_specs = [plgpu.BlockSpec((TILE_N, TILE_K), lambda j: (0, j), transforms=w_transforms),
                        plgpu.BlockSpec((mp, TILE_K), lambda j: (0, j), transforms=x_transforms)]
            plgpu.emit_pipeline(step, grid=(sps,), in_specs=in_specs,
                                max_concurrent_steps=cfg.stages)(q_g.at[rows, ksl], x_g.at[:, ksl])
            return acc_ref[...]

        store_part(out_smem, out_g.at[sp, rows], pl.run_scoped(run, plgpu.ACC((TILE_N, mp), jnp.float32)))

    return split_kernel(body, N, mp, cfg)(q, x_p)


def forward(x2, q, scale, *, cfg: Config, out_dtype, call=None):
    """x [M, K] -> y [M, N] around the kernel (`call`, default the Mosaic GPU kernel; the CPU tests pass a jnp
    stand-in of the same contract: (x_p, q, cfg=) -> part f32 [split, N, Mp])."""
    M = x2.shape[0]
    x_p = jnp.pad(x2.astype(jnp.bfloat16), ((0, padded_m(M) - M), (0, 0)))
    part = (call or _call)(x_p, q, cfg=cfg)
    y = jnp.sum(part, axis=0)[:, :M].T * scale.astype(jnp.float32)[None, :]
    return y.astype(out_dtype)


_int8_mosaic = jax.jit(forward, static_argnames=("cfg", "out_dtype", "call"))


def int8_matmul_mosaic(x, q, scale, *, out_dtype=None, cfg: Config | None = None):
    """x [..., K] @ (q int8 [N, K] * scale f32 [N]).T -> [..., N] (module docstring). ValueError where the kernel
    does not take the shape (callers check `supports` first)."""
    N, K = q.shape
    if x.shape[-1] != K or q.dtype != jnp.int8 or scale.shape != (N,):
        raise ValueError(f"int8_matmul_mosaic wants x [..., {K}], q int8 [N, K], scale [N]; got x {x.shape}, "
                         f"q {q.dtype} {q.shape}, scale {scale.shape}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    if not supports(M, K, N):
        raise ValueError(f"the Mosaic int8 kernel takes M <= {MAX_M}, N % {TILE_N} == 0, K % {TILE_K} == 0; "
                         f"got M={M}, K={K}, N={N}")
    cfg = cfg or default_config(M, K, N)
    y = _int8_mosaic(x2, q, scale, cfg=cfg, out_dtype=out_dtype or x.dtype)
    return y.reshape(*lead, N)
