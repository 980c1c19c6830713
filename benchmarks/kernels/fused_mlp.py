"""The decode int8 SwiGLU MLP on the GPU: one fused kernel (pallas_kernels/quantized_matmul/mlp_nk.py) against the
engine's unfused path (kernel_nk's gate_up, SiLU x up, kernel_nk's down: what QuantLinear runs at M <= 16) and
XLA's bf16 MLP, in one process, at the 1B draft's shape (K 2048, I 8192) and the 8B's (K 4096, I 14336).

Timing as benchmarks/kernels/quantized_matmul.py: one jitted function calls the MLP n times on as many distinct
weight copies as exceed twice the L2 (weights stream from HBM, as in a model), each call depending on the
previous through one element of x; median of --reps runs of 8 back-to-back dispatches. Per row: us, TB/s of
the int8 bytes (weights + scales), % of the 4.2 TB/s ceiling, speed-up against the unfused int8 path and the
bf16 MLP, and the relative error against the float32 reference of the same quantized weights.

  python benchmarks/kernels/fused_mlp.py                    # GPU: both shapes, M 1 / 5 / 16, every variant
  python benchmarks/kernels/fused_mlp.py --quick            # CPU smoke: a tiny shape, kernels in interpret mode
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks.common import measure_hbm_bandwidth, write_result  # noqa: E402
from benchmarks.kernels.quantized_matmul import HBM_CEILING, L2_BYTES, looped, rel, time_us  # noqa: E402
from pallas_kernels.quantized_matmul import kernel_nk, mlp_nk  # noqa: E402

SHAPES = {"1b": (2048, 8192), "8b": (4096, 14336), "tiny": (256, 128)}   # K (= H), I
# fused configurations: (bi, bk, bn, warps, stages, atomic)
FUSED = {"fused": (64, 128, 64, 4, 3, False), "fused_i32": (32, 128, 64, 4, 3, False),
         "fused_i128": (128, 128, 64, 4, 3, False), "fused_k256": (64, 256, 64, 4, 3, False),
         "fused_n128": (64, 128, 128, 4, 3, False), "fused_st4": (64, 128, 64, 4, 4, False),
         "fused_w8": (64, 128, 64, 8, 3, False), "fused_atomic": (64, 128, 64, 4, 3, True),
         "fused_i32_atomic": (32, 128, 64, 4, 3, True)}


def make_weights(K: int, I: int, key):
    """int8 'nk' leaves of one MLP: per-channel symmetric, as weights/quantize.py makes them."""
    kg, kd = jax.random.split(key)

    def quant(w):   # w [N, K] f32 -> int8 [N, K], scale [N]
        s = jnp.max(jnp.abs(w), axis=1) / 127.0
        return jnp.clip(jnp.round(w / s[:, None]), -127, 127).astype(jnp.int8), s.astype(jnp.float32)

    gu_q, gu_s = quant(0.02 * jax.random.normal(kg, (2 * I, K), jnp.float32))
    d_q, d_s = quant(0.02 * jax.random.normal(kd, (K, I), jnp.float32))
    return dict(gu_q=gu_q, gu_s=gu_s, d_q=d_q, d_s=d_s)


def unfused(x, w, interpret=False):
    """The engine's path at M <= 16 (QuantLinear 'xla-nk' -> 'pallas-nk', llama.MLP): two kernels and a fusion."""
    I = w["d_q"].shape[1]
    gu = kernel_nk.int8_matmul_nk(x, w["gu_q"], w["gu_s"], interpret=interpret)
    return kernel_nk.int8_matmul_nk(jax.nn.silu(gu[:, :I]) * gu[:, I:], w["d_q"], w["d_s"], interpret=interpret)


def _gate_up_f32(x, w):
    return (x.astype(jnp.float32) @ (w["gu_q"].astype(jnp.float32) * w["gu_s"][:, None]).T).astype(x.dtype)


def reference(x, w):
    """float32 of the same quantized weights, with the model's bf16 roundings of gate_up and the product."""
    I, dt = w["d_q"].shape[1], x.dtype
    gu = _gate_up_f32(x, w).astype(jnp.float32)
    h = (jax.nn.silu(gu[:, :I]).astype(dt).astype(jnp.float32) * gu[:, I:]).astype(dt).astype(jnp.float32)
    return h @ (w["d_q"].astype(jnp.float32) * w["d_s"][:, None]).T


def bf16_mlp(x, w):
    I = w["down"].shape[0]
    gu = jnp.dot(x, w["gate_up"], preferred_element_type=jnp.float32).astype(x.dtype)
    return jnp.dot(jax.nn.silu(gu[:, :I]) * gu[:, I:], w["down"], preferred_element_type=jnp.float32).astype(x.dtype)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["1b", "8b"], choices=sorted(SHAPES))
    ap.add_argument("--m", type=int, nargs="+", default=[1, 5, 16])
    ap.add_argument("--variants", nargs="+", default=["bf16", "unfused", *FUSED])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--quick", action="store_true", help="CPU smoke: the tiny shape, interpret mode")
    ap.add_argument("--tag", default="")
    a = ap.parse_args()
    interpret = a.quick or jax.default_backend() == "cpu"
    shapes = ["tiny"] if a.quick else a.shapes
    t_start = time.perf_counter()
    hbm = measure_hbm_bandwidth(0.05, 3) if a.quick else measure_hbm_bandwidth()
    print(f"jax {jax.__version__} on {jax.devices()[0]}; x*2 pass {hbm / 1e12:.2f} TB/s", flush=True)
    print(f"{'shape':<5} {'M':>3} {'variant':<12} {'us':>8} {'min_us':>8} {'TB/s':>6} {'%HBM':>5} {'vs unf':>7} "
          f"{'vs bf16':>7} {'rel_err':>8}", flush=True)
    rows = []
    name = "kernel-fused-mlp" + (f"-{a.tag}" if a.tag else "")
    for sname in shapes:
        K, I = SHAPES[sname]
        w0 = make_weights(K, I, jax.random.key(K + I))
        qbytes = sum(int(v.size * v.dtype.itemsize) for v in w0.values())
        copies = 1 if a.quick else int(min(16, max(2, math.ceil(2 * L2_BYTES / qbytes))))
        wq = [w0] + [jax.tree.map(jnp.copy, w0) for _ in range(copies - 1)]
        wb = [dict(gate_up=(w["gu_q"].astype(jnp.float32) * w["gu_s"][:, None]).T.astype(jnp.bfloat16),
                   down=(w["d_q"].astype(jnp.float32) * w["d_s"][:, None]).T.astype(jnp.bfloat16)) for w in wq[:2]]
        wb += [jax.tree.map(jnp.copy, wb[i % 2]) for i in range(2, copies)]
        n = len(wq) if a.quick else int(min(64, max(len(wq), math.ceil(150.0 / (qbytes / 3e12 * 1e6)))))
        for M in a.m:
            x = jax.random.normal(jax.random.key(M), (M, K), jnp.float32).astype(jnp.bfloat16)
            ref = reference(x, w0)
            base = {}
            for v in a.variants:
                row = dict(shape=sname, K=K, I=I, M=M, variant=v, quantized_bytes=qbytes, copies=len(wq), unroll=n)
                if time.perf_counter() - t_start > a.budget_s:
                    rows.append(dict(row, skipped="time budget"))
                    continue
                try:
                    if v == "bf16":
                        op, ws = bf16_mlp, wb
                    elif v == "unfused":
                        op, ws = (lambda x, w: unfused(x, w, interpret)), wq
                    else:
                        bi, bk, bn, warps, stages, atomic = FUSED[v]
                        row.update(bi=bi, bk=bk, bn=bn, num_warps=warps, num_stages=stages, atomic=atomic)
                        op = (lambda x, w, c=FUSED[v]: mlp_nk.int8_mlp_nk(
                            x, w["gu_q"], w["gu_s"], w["d_q"], w["d_s"], bi=c[0], bk=c[1], bn=c[2], num_warps=c[3],
                            num_stages=c[4], atomic=c[5], interpret=interpret))
                        ws = wq
                        if not mlp_nk.supports(M, K, I, K, bi=bi, bk=bk, bn=bn):
                            rows.append(dict(row, skipped="shape"))
                            continue
                    us, us_min = time_us(looped(op, len(ws), n), (x, ws), n, a.reps, 1 if a.quick else 8)
                    base[v] = us
                    err = rel(jax.jit(op)(x, ws[0]).astype(jnp.float32), ref)
                    row.update(us=us, us_min=us_min, TBps=qbytes / us / 1e6, pct_hbm=100 * qbytes / us / 1e6 / (
                        HBM_CEILING / 1e12), speedup_vs_unfused=base.get("unfused", float("nan")) / us,
                        speedup_vs_bf16=base.get("bf16", float("nan")) / us, rel_err=err)
                    print(f"{sname:<5} {M:>3} {v:<12} {us:>8.1f} {us_min:>8.1f} {row['TBps']:>6.2f} "
                          f"{row['pct_hbm']:>4.0f}% {row['speedup_vs_unfused']:>6.2f}x {row['speedup_vs_bf16']:>6.2f}x "
                          f"{err:>8.1e}", flush=True)
                except Exception as e:   # one failing variant must not lose the run
                    row["error"] = f"{type(e).__name__}: {str(e)[:600]}"
                    print(f"{sname:<5} {M:>3} {v:<12} ERROR {row['error'][:300]}", flush=True)
                rows.append(row)
                write_result(name, dict(hbm_x2_TBps=hbm / 1e12, hbm_ceiling_TBps=HBM_CEILING / 1e12,
                                        interpret=interpret, wall_s=time.perf_counter() - t_start, rows=rows))
    write_result(name, dict(hbm_x2_TBps=hbm / 1e12, hbm_ceiling_TBps=HBM_CEILING / 1e12, interpret=interpret,
                            wall_s=time.perf_counter() - t_start, rows=rows))


if __name__ == "__main__":
    main()
