"""How does XLA:GPU compile a bf16 [M, K] x [K, N] dot at decode sizes, and what does each form cost? (issue 21.)

Why: the 1B-shaped draft's batch-1 step profile (results/step-profile-1b-60b8838-2026-12-04.json, 1-token bucket)
shows qkv / o projections as `input_reduce_fusion` + `loop_multiply_fusion` kernels instead of gemms, and the
probe's own plain layer dots at M = 1 took 2.76 ms x16 layers, more than the whole step. XLA's GPU algebraic
simplifier strength-reduces a dot to multiply + reduce when one operand is a vector (an M = 1 row is one once the
degenerate dimension is removed) and the matrix is "too small for rewriting" (operands under ~10M elements): a
2048 x 3072 qkv qualifies, Llama-3-8B's projections (>= 16.8M) do not. Padding the row count to 2 keeps a gemm.

For each projection shape of the 1B and 8B presets and M in --rows: the optimized HLO's form (gemm / reduce) and
the device time per dot from back-to-back calls of a program holding R independent dots (R weights, so the launch
is amortised), beside the HBM roofline of the weight bytes (the measured copy bandwidth).

  python benchmarks/probes/small_dot_forms.py [--rows 1 2 16] [--reps 8]
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks.common import measure_hbm_bandwidth, write_result  # noqa: E402

# name -> (K, N): the four projections of one layer ([in, out] as the models store them)
SHAPES = {
    "1b.qkv": (2048, 3072), "1b.o": (2048, 2048), "1b.gate_up": (2048, 16384), "1b.down": (8192, 2048),
    "8b.qkv": (4096, 6144), "8b.o": (4096, 4096), "8b.gate_up": (4096, 28672), "8b.down": (14336, 4096),
}


def form(hlo: str) -> str:
    """'gemm' if the optimized HLO calls a library / Triton gemm, 'reduce' if the dot became a reduction."""
    if re.search(r"__cublas|gemm_fusion|triton_gemm|__triton|cublas", hlo):
        return "gemm"
    if "reduce(" in hlo or "reduce-window" in hlo:
        return "reduce"
    return "other"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 16])
    ap.add_argument("--reps", type=int, default=8, help="independent dots (own weights) per program")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    a = ap.parse_args(argv)
    hbm = measure_hbm_bandwidth()
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; HBM {hbm / 1e12:.2f} TB/s", flush=True)
    key = jax.random.PRNGKey(0)
    rows = []
    for name in a.shapes:
        K, N = SHAPES[name]
        ws = [jax.random.normal(jax.random.fold_in(key, i), (K, N), jnp.bfloat16) for i in range(a.reps)]

        def f(x, *ws):
            return [x @ w for w in ws]  # R independent dots: the weights stream once each

        floor_us = K * N * 2 / hbm * 1e6
        for M in a.rows:
            x = jax.random.normal(key, (M, K), jnp.bfloat16)
            jf = jax.jit(f)
            kind = form(jf.lower(x, *ws).compile().as_text())
            jax.block_until_ready(jf(x, *ws))
            t0 = time.perf_counter()
            for _ in range(a.iters):
                out = jf(x, *ws)
            jax.block_until_ready(out)
            us = (time.perf_counter() - t0) / a.iters / a.reps * 1e6
            rows.append(dict(shape=name, K=K, N=N, M=M, form=kind, us_per_dot=round(us, 2),
                             floor_us=round(floor_us, 2), pct_hbm=round(100 * floor_us / us, 1)))
            print(f"{name:11s} [{M:3d}, {K}] x [{K}, {N}]: {kind:6s} {us:8.2f} µs per dot "
                  f"(weight roofline {floor_us:.2f} µs, {100 * floor_us / us:.0f}% of HBM)", flush=True)
    print("wrote", write_result("small-dot-forms", dict(hbm_TBps=hbm / 1e12, reps=a.reps, rows=rows)))


if __name__ == "__main__":
    main()
