"""XLA's bf16 dot on the Llama-3-8B projection shapes by M, under per-executable compiler options (issue 17 item 4:
the 256-token prefill step ran at ~43% of the matmul rate, and its plain layer dots alone took 9.6 ms at M = 256,
i.e. neither compute- nor bandwidth-bound). Each variant compiles the same jitted dot with other XLA GPU options:

  default        the engine's options today
  cublas         xla_gpu_enable_triton_gemm=false: cuBLAS(Lt) only, no Triton GEMM fusions
  autotune0      xla_gpu_autotune_level=0: no autotuning (the heuristic's first choice)

Time: a jitted lax.fori_loop of --inner dependent dots (the output feeds a cheap add into the next input so XLA
cannot hoist it), median of --reps, divided by inner; FLOP rate vs the 8192^3 rate; weight TB/s vs the measured HBM
bandwidth. Random normal inputs (never zeros).

  python benchmarks/probes/gemm_m_sweep.py [--m 1 16 64 256 512 2048] [--variants default cublas]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.common import measure_hbm_bandwidth, measure_matmul_rate, write_result  # noqa: E402

SHAPES = {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096),
          "lm_head": (4096, 128256)}
VARIANTS = {"default": {}, "cublas": {"xla_gpu_enable_triton_gemm": False}, "autotune0": {"xla_gpu_autotune_level": 0}}


def timed(fn, args, reps):
    jax.block_until_ready(fn(*args))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, nargs="+", default=[1, 16, 64, 256, 512, 2048])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES))
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--inner", type=int, default=20)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    gpu = jax.default_backend() == "gpu"
    rate = measure_matmul_rate()
    hbm = measure_hbm_bandwidth()
    print(f"bf16 matmul rate {rate / 1e12:.0f} TFLOP/s, HBM {hbm / 1e12:.2f} TB/s")
    rows = []
    for sname in a.shapes:
        K, N = SHAPES[sname] if gpu else (256, 384)
        w = jax.random.normal(jax.random.key(1), (K, N), jnp.bfloat16)
        for M in a.m:
            x = jax.random.normal(jax.random.key(2), (M, K), jnp.bfloat16)

            def loop(x, w):
                def body(i, c):
                    acc, xx = c
                    y = xx @ w
                    return acc + y[:, :1].astype(jnp.float32).sum(), xx + (y[:, :1] * 0).astype(xx.dtype)
                return jax.lax.fori_loop(0, a.inner, body, (jnp.float32(0), x))[0]
            line = []
            for var in a.variants:
                comp = (jax.jit(loop).lower(x, w).compile(compiler_options=VARIANTS[var] or None) if gpu
                        else jax.jit(loop))
                t = timed(comp, (x, w), a.reps) / a.inner
                flops, byts = 2 * M * K * N, (K * N + M * K + M * N) * 2
                rows.append(dict(shape=sname, M=M, K=K, N=N, variant=var, us=t * 1e6,
                                 pct_matmul=100 * flops / t / rate, tbps=byts / t / 1e12, pct_hbm=100 * byts / t / hbm))
                line.append(f"{var} {t * 1e6:8.1f} us {100 * flops / t / rate:5.1f}%mm {byts / t / 1e12:5.2f} TB/s")
            print(f"{sname:8s} M={M:5d} | " + " | ".join(line), flush=True)
    write_result("gemm-m-sweep", dict(matmul_tflops=rate / 1e12, hbm_tbps=hbm / 1e12, inner=a.inner, rows=rows))


if __name__ == "__main__":
    main()
