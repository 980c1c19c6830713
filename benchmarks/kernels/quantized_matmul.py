"""Quantized matmul on the GPU: the Pallas int8 / int4 kernels vs XLA's bf16 dot, XLA's int8 / int4 weight-only
dots and XLA's fp8 W8A8 dot, at Llama-3-8B shapes.

For each weight [K, N] and each M (tokens in the step), in one process:
  bf16        x @ w (bf16 weights): the baseline every speed-up is relative to
  xla_int8    x @ q.astype(bf16) * scale            (XLA weight-only int8; ANCHORS: slower than bf16 on the H200)
  xla_int4    unpack + dequantize to bf16, then dot  (XLA; hand-packed int4 does not fuse into the GEMM)
  fp8_w8a8    per-token e4m3 activations x e4m3 weights, XLA's native fp8 dot (f32 out), scales on the output;
              fp8_w8a8_bf16dot the same with a bf16 dot output (the form measured in ANCHORS.md)
  int8 / int4 the Pallas kernels (kernel.py) with their default configuration for that M;
              --sweep adds block / split-K / pipeline variants (printed as int8[bn64,s4,...]) to tune the defaults.
Timing: one jitted function calls the op max(`--inner`, enough for ~4 ms of weight streaming at 2 TB/s) times on
as many distinct weight copies as needed to exceed twice the 50 MB L2 (so weights stream from HBM, as in a real
model), each call depending on the previous one through one element of x (no hoisting); time = median over
`--reps` runs / calls.
Reported: time (us), GB/s of bytes moved (weights + scales + x + out) and % of the HBM ceiling measured first
(an XLA x * 2 pass; ANCHORS: 3.33 TB/s, and ~4.3 TB/s for a torch copy), TFLOP/s and % of the measured bf16
(789) / fp8 (938) peaks, speed-up vs bf16, and the relative error vs the float32 reference on the same
quantized weights (and vs the float weights). Targets (issue 4): int8 >= 1.8x and int4 >= 3.0x bf16 at M <= 16;
never slower than bf16 at M >= 256; fp8 W8A8 >= 1.15x bf16 at M = 2048.

  python benchmarks/kernels/quantized_matmul.py                       # H200, < 8 min (time budget cuts the end)
  python benchmarks/kernels/quantized_matmul.py --smoke               # CPU: tiny shapes, kernel in interpret mode
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

from benchmarks.common import measure_hbm_bandwidth, write_result  # noqa: E402
from jaxinfer.weights.quantize import quantized_leaves  # noqa: E402
from jaxinfer.config import parse_quantization  # noqa: E402
from pallas_kernels.quantized_matmul import kernel as qk  # noqa: E402
from pallas_kernels.quantized_matmul import reference as qr  # noqa: E402
from pallas_kernels.quantized_matmul import xla as qx  # noqa: E402

BF16_PEAK_TFLOPS, FP8_PEAK_TFLOPS = 789.0, 938.0  # measured on the H200 (/work/shared/ANCHORS.md)
L2_BYTES = 50e6
RUN_S, ASSUMED_BPS = 4e-3, 2e12  # each timed run: >= 4 ms of calls at an assumed 2 TB/s (only sets the call count)
SMALL_SWEEP = [dict(block_n=64, split_k=1), dict(block_n=64, split_k=4), dict(block_n=128, split_k=2),
               dict(block_n=32, split_k=8), dict(block_n=64, split_k=8, num_stages=3),
               dict(block_n=128, split_k=4, num_warps=8)]
LARGE_SWEEP = [dict(block_m=128, block_n=256, num_warps=8), dict(block_m=64, block_n=128, num_stages=4),
               dict(block_m=128, block_n=128, num_stages=4), dict(block_m=128, block_n=64, num_warps=4)]


def _nbytes(tree) -> int:
    return sum(int(x.size) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def build_impls(K, N, M, interpret, sweep):
    """name -> (op(x, weights) -> [M, N], weights pytree factory(key) -> pytree)."""
    i8, i4, f8 = parse_quantization("int8"), parse_quantization("int4"), parse_quantization("fp8")

    def wf(spec):
        return lambda w: quantized_leaves(w, spec, jnp.bfloat16)

    impls = {
        "bf16": (lambda x, w: jnp.dot(x, w["w"], preferred_element_type=jnp.float32).astype(x.dtype),
                 lambda w: {"w": w.astype(jnp.bfloat16)}),
        "xla_int8": (lambda x, w: qx.int8_matmul_xla(x, w["q"], w["scale"]), wf(i8)),
        "xla_int4": (lambda x, w: qx.int4_matmul_xla(x, w["q"], w["scale"], w["offset"], group_size=128), wf(i4)),
        "fp8_w8a8": (lambda x, w: qx.fp8_matmul_xla(x, w["q"], w["scale"]), wf(f8)),
        "fp8_w8a8_bf16dot": (lambda x, w: qx.fp8_matmul_xla(x, w["q"], w["scale"], dot_dtype=jnp.bfloat16),
                             wf(f8)),
        "int8": (lambda x, w: qk.int8_matmul(x, w["q"], w["scale"], interpret=interpret), wf(i8)),
        "int4": (lambda x, w: qk.int4_matmul(x, w["q"], w["scale"], w["offset"], group_size=128,
                                             interpret=interpret), wf(i4)),
    }
    if sweep:
        variants = SMALL_SWEEP if M <= qk.SMALL_M else LARGE_SWEEP
        for v in variants:
            tag = ",".join(f"{k.replace('block_', 'b').replace('split_k', 's').replace('num_', '')}{val}"
                           for k, val in v.items())
            impls[f"int8[{tag}]"] = (lambda x, w, v=v: qk.int8_matmul(x, w["q"], w["scale"], interpret=interpret,
                                                                      **v), wf(i8))
            impls[f"int4[{tag}]"] = (lambda x, w, v=v: qk.int4_matmul(
                x, w["q"], w["scale"], w["offset"], group_size=128, interpret=interpret, **v), wf(i4))
    return impls


def looped(op, copies: int, inner: int):
    """inner calls over `copies` weight pytrees; each call's x carries one element of the previous output."""
    @jax.jit
    def run(x, ws):
        out = None
        for i in range(inner):
            if out is not None:
                x = x.at[0, 0].add((out[0, 0] * 0).astype(x.dtype))
            out = op(x, ws[i % copies])
        return out
    return run


def time_us(run, args, inner, reps):
    jax.block_until_ready(run(*args))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(run(*args))
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts)) / inner * 1e6


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=["4096x14336", "4096x28672", "14336x4096"],
                    help="KxN list; the other 8B shapes: 4096x6144 (qkv) 4096x4096 (o)")
    ap.add_argument("--m", type=int, nargs="+", default=[1, 16, 2048, 256, 4, 64],
                    help="inner loop, most informative first")
    ap.add_argument("--impls", nargs="+", default=None, help="subset of impl names (default: all)")
    ap.add_argument("--sweep", action="store_true", help="add kernel block / split-K variants")
    ap.add_argument("--inner", type=int, default=8, help="calls per timed run (at least the weight copies)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=420.0, help="skip the remaining configs past this time")
    ap.add_argument("--smoke", action="store_true", help="CPU smoke test: tiny shapes, kernel in interpret mode")
    from benchmarks.common import add_profile_arg, start_profile
    add_profile_arg(ap)
    a = ap.parse_args()
    start_profile(a.profile)
    t_start = time.perf_counter()
    interpret = a.smoke or jax.default_backend() == "cpu"
    if a.smoke:
        shapes, ms, hbm, reps, inner = [(256, 128)], [1, 32], measure_hbm_bandwidth(0.05, 3), 1, 2
    else:
        shapes = [tuple(map(int, s.lower().split("x"))) for s in a.shapes]
        ms, hbm, reps, inner = a.m, measure_hbm_bandwidth(), a.reps, a.inner
    print(f"jax {jax.__version__} on {jax.devices()[0]}; HBM ceiling (x*2) {hbm / 1e9:.0f} GB/s", flush=True)
    print(f"{'K':>6} {'N':>6} {'M':>5} {'impl':<28} {'us':>9} {'GB/s':>7} {'%HBM':>6} {'TFLOP/s':>8} {'%peak':>6} "
          f"{'vs bf16':>8} {'err_q':>8} {'err_f':>7}", flush=True)
    rows = []
    key = jax.random.key(0)
    for K, N in shapes:
        for M in ms:
            if time.perf_counter() - t_start > a.budget_s:
                print(f"{K:>6} {N:>6} {M:>5} skipped: time budget", flush=True)
                rows.append(dict(K=K, N=N, M=M, skipped="time budget"))
                continue
            kw, kx = jax.random.split(jax.random.fold_in(key, K * 7 + N + M))
            w = 0.02 * jax.random.normal(kw, (K, N), jnp.float32)
            x = jax.random.normal(kx, (M, K), jnp.float32).astype(jnp.bfloat16)
            exact = jnp.dot(x.astype(jnp.float32), w, precision=jax.lax.Precision.HIGHEST)
            impls = build_impls(K, N, M, interpret, a.sweep and not a.smoke)
            if a.impls:
                impls = {k: v for k, v in impls.items() if k.split("[")[0] in a.impls or k in a.impls}
            base_us = None
            cache = {}
            for name, (op, make) in impls.items():
                row = dict(K=K, N=N, M=M, impl=name)
                try:
                    base = name.split("[")[0]
                    if base not in cache:
                        w0 = make(w)
                        wbytes = _nbytes(w0)
                        copies = 1 if a.smoke else int(min(16, max(2, np.ceil(2 * L2_BYTES / wbytes))))
                        # distinct copies (w + tiny noise is not needed: different buffers are enough)
                        cache[base] = ([w0] + [jax.tree.map(jnp.copy, w0) for _ in range(copies - 1)], wbytes)
                    ws, wbytes = cache[base]
                    # >= RUN_S of device work per timed run, so the jitted call's fixed cost (dispatch, first
                    # launch: tens of us) stays ~1% (the 2026-12-01 sweep ran 8 calls = ~0.5 ms per run)
                    n_inner = max(inner, len(ws))
                    if not a.smoke:
                        n_inner = max(n_inner, int(np.ceil(RUN_S / (wbytes / ASSUMED_BPS))))
                    us = time_us(looped(op, len(ws), n_inner), (x, ws), n_inner, reps)
                    out = jax.jit(op)(x, ws[0])
                    moved = wbytes + x.size * 2 + M * N * 2
                    flops = 2.0 * M * K * N
                    peak = FP8_PEAK_TFLOPS if name.startswith("fp8") else BF16_PEAK_TFLOPS
                    if name == "bf16":
                        base_us = us
                    ref = None
                    if base in ("int8", "xla_int8"):
                        ref = qr.int8_matmul_reference(x, ws[0]["q"], ws[0]["scale"], out_dtype=jnp.float32)
                    elif base in ("int4", "xla_int4"):
                        ref = qr.int4_matmul_reference(x, ws[0]["q"], ws[0]["scale"], ws[0]["offset"],
                                                       group_size=128, out_dtype=jnp.float32)
                    elif base.startswith("fp8"):
                        ref = qr.fp8_matmul_reference(x, ws[0]["q"], ws[0]["scale"], out_dtype=jnp.float32)
                    row.update(us=us, gbps=moved / us / 1e3, pct_hbm=100 * moved / (us * 1e-6) / hbm,
                               tflops=flops / us / 1e6, pct_peak=100 * flops / (us * 1e-6) / (peak * 1e12),
                               weight_bytes=wbytes, copies=len(ws),
                               speedup_vs_bf16=None if base_us is None else base_us / us,
                               rel_err_vs_quantized_ref=None if ref is None else rel(out, ref),
                               rel_err_vs_float=rel(out, exact))
                    print(f"{K:>6} {N:>6} {M:>5} {name:<28} {us:>9.1f} {row['gbps']:>7.0f} {row['pct_hbm']:>5.1f}% "
                          f"{row['tflops']:>8.1f} {row['pct_peak']:>5.1f}% "
                          f"{row['speedup_vs_bf16'] or float('nan'):>7.2f}x "
                          f"{row['rel_err_vs_quantized_ref'] if ref is not None else float('nan'):>8.1e} "
                          f"{row['rel_err_vs_float']:>7.1e}", flush=True)
                except Exception as e:  # one failing variant must not lose the run
                    row["error"] = f"{type(e).__name__}: {str(e)[:600]}"
                    print(f"{K:>6} {N:>6} {M:>5} {name:<28} ERROR {row['error'][:300]}", flush=True)
                rows.append(row)
            del w, x, exact, cache
    path = write_result("kernel-quantized-matmul", dict(
        hbm_ceiling_gbps=hbm / 1e9, bf16_peak_tflops=BF16_PEAK_TFLOPS, fp8_peak_tflops=FP8_PEAK_TFLOPS,
        inner=inner, reps=reps, interpret=interpret, sweep=a.sweep, small_m=qk.SMALL_M,
        wall_s=time.perf_counter() - t_start, rows=rows))
    print(f"wrote {path} in {time.perf_counter() - t_start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
