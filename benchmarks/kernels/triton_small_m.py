"""The Triton small-M quantized kernels (pallas_kernels/quantized_matmul/triton_small_m.py) on the GPU, in two
processes of one call:

  --part sweep   launches the kernels with torch tensors (Triton's own launcher) over a grid of block shapes /
                 warps / stages at the 8B projection shapes and M in {1, 16}, beside cuBLAS's bf16 GEMV
                 (torch.mm on [N, K] bf16 weights) of the same shape; each op is timed by replaying a CUDA graph
                 of R launches over as many weight copies as exceed 2.5x the 50 MB L2 (weights stream from HBM,
                 as in a model). Writes the best configuration per (kind, shape, M) to --best.
  --part jax     the JAX entry points (jax-triton) with the default configuration and with the sweep's best, beside
                 XLA's bf16 dot and the engine's current int8 path (XLA convert + dot on [N, K] weights), each timed
                 as a jitted loop over the weight copies: the figure the engine will see.
Both print TB/s of quantized bytes (weights + scales + offsets) and % of the 4.2 TB/s HBM ceiling, the speed-up
over bf16, and the relative error against a float32 reference of the same quantized weights.

  python benchmarks/kernels/triton_small_m.py --part sweep --best /tmp/best.json
  python benchmarks/kernels/triton_small_m.py --part jax --best /tmp/best.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")   # torch and jax share the GPU across processes
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from pallas_kernels.quantized_matmul import triton_small_m as T  # noqa: E402

HBM = 4.2e12
L2_BYTES = 50e6
GROUP = 128
SHAPES = {"gate_up": (4096, 28672), "down": (14336, 4096), "qkv": (4096, 6144), "o": (4096, 4096),
          "lm_head": (4096, 128256)}     # (K, N)
ORDER = ["gate_up", "down", "qkv", "o", "lm_head"]


def grid_configs(kind: str, M: int, K: int, N: int):
    """Candidate configurations: block shapes x warps x stages, each at split-K 1, 2, 4, 8 and 16 (those that
    leave >= 2 K steps per split and at most 8 programs per SM)."""
    out = []

    def add(bm, bn, bk, dot, w, s):
        for split in (1, 2, 4, 8, 16):
            if kind == "int4":
                split = T.int4_split(K, bk, split)
            programs = T._cdiv(N, bn) * T._cdiv(M, bm) * split
            if K // (bk * split) < 2 or programs > 8 * T.DEFAULT_NUM_SMS and split > 1:
                continue
            c = T.Config(bm, bn, bk, split, dot, w, s)
            if c not in out:
                out.append(c)

    if kind == "int8":
        if M == 1:
            for bn, bk, w in ((16, 512, 4), (32, 256, 4), (32, 512, 8)):
                add(1, bn, bk, False, w, 3)
        for bn, bk in ((32, 128), (32, 256), (64, 128), (64, 256), (64, 512), (128, 256)):
            add(16, bn, bk, True, 4, 3)
    else:
        forms = ((False, 1), (True, 16)) if M == 1 else ((True, 16),)
        for dot, bm in forms:
            for bn, w, s in ((32, 4, 3), (64, 4, 3), (64, 8, 4), (128, 4, 3), (128, 8, 4)):
                add(bm, bn, GROUP, dot, w, s)
    return out


# ---- part 1: torch launches --------------------------------------------------------------------------------------
def sweep(args):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    rows, best = [], {}
    t_start = time.time()

    def graph_us(step, copies, est_us):
        for i in range(copies):
            step(i)
        torch.cuda.synchronize()
        R = copies * max(1, math.ceil(3000.0 / (est_us * copies)))
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for r in range(R):
                step(r % copies)
        g.replay()
        torch.cuda.synchronize()
        ts = []
        for _ in range(7):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            g.replay()
            e1.record()
            e1.synchronize()
            ts.append(e0.elapsed_time(e1) * 1e3 / R)
        del g
        return statistics.median(ts)

    for name in ORDER:
        K, N = SHAPES[name]
        for kind in ("int8", "int4"):
            if time.time() - t_start > args.budget_s:
                print(f"budget: skipping {kind} {name}", flush=True)
                continue
            if kind == "int8":
                qbytes = N * K + 4 * N
            else:
                qbytes = N * K // 2 + 2 * 2 * (K // GROUP) * N
            copies = max(1, math.ceil(2.5 * L2_BYTES / qbytes))
            if kind == "int8":
                ws = [torch.randint(-127, 128, (N, K), dtype=torch.int8, device=dev, generator=gen)
                      for _ in range(copies)]
                sc = [torch.rand(N, device=dev, generator=gen) * 0.01 + 1e-3 for _ in range(copies)]
                wf0 = ws[0].float() * sc[0][:, None]                           # [N, K]
            else:
                ws = [torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, device=dev, generator=gen)
                      for _ in range(copies)]
                sc = [(torch.rand(K // GROUP, N, device=dev, generator=gen) * 0.02 + 1e-3).bfloat16()
                      for _ in range(copies)]
                of = [(-8 * s.float()).bfloat16() for s in sc]
                p = ws[0].view(N, K // GROUP, GROUP // 2)
                u = torch.cat([p & 15, p >> 4], dim=2).reshape(N, K).float()    # group-halves order
                s_rep = sc[0].float().repeat_interleave(GROUP, 0).T             # [N, K]
                o_rep = of[0].float().repeat_interleave(GROUP, 0).T
                wf0 = u * s_rep + o_rep
            b16_copies = max(1, math.ceil(2.5 * L2_BYTES / (2 * N * K)))
            w16 = [torch.randn(N, K, device=dev, dtype=torch.bfloat16, generator=gen) for _ in range(b16_copies)]
            for M in args.m:
                x = torch.randn(M, K, device=dev, dtype=torch.bfloat16, generator=gen)
                bf16_us = graph_us(lambda i: torch.mm(x, w16[i].T), b16_copies, 2 * N * K / 3e12 * 1e6)
                ref = x.float() @ wf0.T
                cands = grid_configs(kind, M, K, N)
                results = []
                for cfg in cands:
                    try:
                        # the jax-triton entry points' grid and constexprs (launch_params), torch tensors
                        grid, split, meta = T.launch_params(kind, M, N, K, cfg, GROUP if kind == "int4" else None)
                        part = torch.empty(split, M, N, device=dev, dtype=torch.float32)
                        launch = dict(F32_DOT=False, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **meta)
                        if kind == "int8":
                            def step(i, grid=grid, part=part, launch=launch):
                                T.int8_nk_kernel[grid](x, ws[i], sc[i], M, N, part, **launch)
                                return part.sum(0).bfloat16()
                        else:
                            xs = x.float().reshape(M, K // GROUP, GROUP).sum(2).contiguous()   # int4_kernel_inputs

                            def step(i, grid=grid, part=part, launch=launch, xs=xs):
                                T.int4_nk_kernel[grid](x, ws[i].view(torch.int32), sc[i], of[i], xs, M, N, part,
                                                       **launch)
                                return part.sum(0).bfloat16()
                        y = step(0).float()
                        err = float((y - ref).norm() / ref.norm())
                        us = graph_us(step, copies, qbytes / 3e12 * 1e6)
                        row = dict(kind=kind, shape=name, M=M, K=K, N=N, cfg=cfg.__dict__, us=us,
                                   tbps=qbytes / us / 1e6, pct_hbm=100 * qbytes / us / 1e6 / (HBM / 1e12),
                                   bf16_us=bf16_us, speedup=bf16_us / us, err=err)
                    except Exception as e:  # noqa: BLE001 - a config that does not compile is a result
                        row = dict(kind=kind, shape=name, M=M, cfg=cfg.__dict__, error=repr(e)[:300])
                    rows.append(row)
                    if "us" in row:
                        results.append(row)
                ok = [r for r in results if r["err"] < 2e-2]
                if ok:
                    b = min(ok, key=lambda r: r["us"])
                    best[f"{kind}/{name}/{M}"] = b["cfg"]
                    print(f"{kind:5s} {name:8s} M={M:<3d} best {b['us']:8.2f} us {b['tbps']:5.2f} TB/s "
                          f"({b['pct_hbm']:4.1f}% HBM) bf16 {bf16_us:8.2f} us -> {b['speedup']:.2f}x  err "
                          f"{b['err']:.1e}  cfg {b['cfg']}", flush=True)
                bad = [r for r in results if r["err"] >= 2e-2]
                if bad:
                    print(f"  {len(bad)} configs with err >= 2e-2, e.g. {bad[0]['cfg']} err {bad[0]['err']:.2e}")
            del ws, w16
            torch.cuda.empty_cache()
    with open(args.best, "w") as f:
        json.dump(best, f, indent=1)
    with open(args.out, "w") as f:
        json.dump(dict(rows=rows, best=best), f, indent=1)
    print(f"sweep: {len(rows)} rows in {time.time() - t_start:.0f} s", flush=True)


# ---- part 2: JAX entry points --------------------------------------------------------------------------------------
def jax_part(args):
    import jax
    import jax.numpy as jnp
    import numpy as np

    from pallas_kernels.quantized_matmul import xla_fused as qf

    best = {}
    if args.best and os.path.exists(args.best):
        best = json.load(open(args.best))
    rng = np.random.default_rng(0)
    rows = []

    def time_loop(op, x, copies, per_us):
        unroll = max(1, math.ceil(2000.0 / (per_us * len(copies))))
        seq = copies * unroll

        @jax.jit
        def f(x, ws):
            return [op(x, w) for w in ws]

        jax.block_until_ready(f(x, seq))
        ts = []
        for _ in range(9):
            t0 = time.perf_counter()
            jax.block_until_ready(f(x, seq))
            ts.append((time.perf_counter() - t0) * 1e6 / len(seq))
        return statistics.median(ts)

    for name in args.shapes or ORDER:
        K, N = SHAPES[name]
        b16_copies = max(1, math.ceil(2.5 * L2_BYTES / (2 * N * K)))
        w16 = [jnp.asarray(rng.standard_normal((N, K), np.float32), jnp.bfloat16) for _ in range(b16_copies)]
        q8bytes = N * K + 4 * N
        c8 = max(1, math.ceil(2.5 * L2_BYTES / q8bytes))
        q8 = [(jnp.asarray(rng.integers(-127, 128, (N, K)), jnp.int8),
               jnp.asarray(rng.uniform(1e-3, 1e-2, N), jnp.float32)) for _ in range(c8)]
        q4bytes = N * K // 2 + 4 * (K // GROUP) * N
        c4 = max(1, math.ceil(2.5 * L2_BYTES / q4bytes))
        q4 = []
        for _ in range(c4):
            s = jnp.asarray(rng.uniform(1e-3, 2e-2, (K // GROUP, N)), jnp.bfloat16)
            q4.append((jnp.asarray(rng.integers(0, 256, (N, K // 2)), jnp.uint8), s, (-8 * s.astype(jnp.float32)
                                                                                        ).astype(jnp.bfloat16)))
        for M in args.m:
            x = jnp.asarray(rng.standard_normal((M, K), np.float32), jnp.bfloat16)
            bf16 = time_loop(lambda x, w: jnp.dot(x, w.T, preferred_element_type=jnp.float32).astype(x.dtype),
                             x, w16, 2 * N * K / 3e12 * 1e6)
            conv = time_loop(lambda x, w: qf.int8_convert_xla(x, w[0], w[1], layout="nk"), x, q8,
                             q8bytes / 3e12 * 1e6)
            line = dict(shape=name, M=M, bf16_us=bf16, int8_xla_nk_us=conv)
            if args.pallas:   # the engine's Pallas-Triton port (kernel_nk.py), default configuration
                from pallas_kernels.quantized_matmul import kernel_nk
                pal = time_loop(lambda x, w: kernel_nk.int8_matmul_nk(x, w[0], w[1]), x, q8, q8bytes / 3e12 * 1e6)
                line["int8_pallas_nk_us"] = pal
                if "int4" in args.pallas_kinds:   # int4 [N, K/2] (the GPU int4 default) beside XLA's dequantize + dot
                    from pallas_kernels.quantized_matmul import xla as qx
                    line["int4_pallas_nk_us"] = time_loop(
                        lambda x, w: kernel_nk.int4_matmul_nk(x, w[0], w[1], w[2], group_size=GROUP), x, q4,
                        q4bytes / 3e12 * 1e6)
                    line["int4_xla_packed_nk_us"] = time_loop(
                        lambda x, w: qx.int4_matmul_xla_nk(x, w[0], w[1], w[2], group_size=GROUP), x, q4,
                        q4bytes / 3e12 * 1e6)
            for kind, copies, qb in (("int8", q8, q8bytes), ("int4", q4, q4bytes)):
                if kind not in args.kinds:
                    continue
                for label, cfg in (("default", None), ("best", best.get(f"{kind}/{name}/{min(M, 16) if M > 1 else 1}"))):
                    if label == "best" and cfg is None:
                        continue
                    c = T.Config(**cfg) if cfg else None
                    if c is not None and M > 1 and not c.dot:
                        continue
                    try:
                        if kind == "int8":
                            op = lambda x, w, c=c: T.int8_matmul_nk(x, w[0], w[1], cfg=c)
                            w0 = copies[0]
                            ref = x.astype(jnp.float32) @ (w0[0].astype(jnp.float32) * w0[1][:, None]).T
                        else:
                            op = lambda x, w, c=c: T.int4_matmul_nk(x, w[0], w[1], w[2], group_size=GROUP, cfg=c)
                            from pallas_kernels.quantized_matmul.reference import dequantize_int4
                            w0 = copies[0]
                            ref = x.astype(jnp.float32) @ dequantize_int4(w0[0].T, w0[1], w0[2], GROUP)
                        y = jax.jit(op)(x, copies[0]).astype(jnp.float32)
                        err = float(jnp.linalg.norm(y - ref) / jnp.linalg.norm(ref))
                        us = time_loop(op, x, copies, qb / 3e12 * 1e6)
                        line[f"{kind}_{label}_us"] = us
                        line[f"{kind}_{label}_tbps"] = qb / us / 1e6
                        line[f"{kind}_{label}_err"] = err
                    except Exception as e:  # noqa: BLE001
                        line[f"{kind}_{label}_error"] = repr(e)[-3000:]
                        if not line.get("printed_error"):
                            print(f"{kind} {label} {name} M={M}: ...{repr(e)[-2500:]}", flush=True)
                            line["printed_error"] = True
            rows.append(line)
            msg = f"jax {name:8s} M={M:<3d} bf16 {bf16:7.2f} us  int8 xla-nk {conv:7.2f} ({bf16 / conv:.2f}x)"
            if "int8_pallas_nk_us" in line:
                pal = line["int8_pallas_nk_us"]
                msg += f" | int8 pallas-nk {pal:7.2f} {q8bytes / pal / 1e6:4.2f} TB/s {bf16 / pal:.2f}x"
            if "int4_pallas_nk_us" in line:
                p4, x4 = line["int4_pallas_nk_us"], line["int4_xla_packed_nk_us"]
                msg += (f" | int4 pallas-nk {p4:7.2f} {q4bytes / p4 / 1e6:4.2f} TB/s {bf16 / p4:.2f}x"
                        f" (xla-packed-nk {x4:7.2f})")
            for kind, qb in (("int8", q8bytes), ("int4", q4bytes)):
                for label in ("default", "best"):
                    us = line.get(f"{kind}_{label}_us")
                    if us:
                        msg += (f" | {kind} {label} {us:7.2f} {qb / us / 1e6:4.2f} TB/s {bf16 / us:.2f}x "
                                f"e{line[f'{kind}_{label}_err']:.0e}")
            print(msg, flush=True)
        del w16, q8, q4
    with open(args.out, "w") as f:
        json.dump(dict(rows=rows, device=str(jax.devices()[0]), jax=jax.__version__,
                       commit=os.environ.get("JAXINFER_COMMIT", "unknown"),
                       date=time.strftime("%Y-%m-%d")), f, indent=1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("sweep", "jax"), required=True)
    ap.add_argument("--m", type=int, nargs="+", default=None)
    ap.add_argument("--best", default="/tmp/triton_small_m_best.json")
    ap.add_argument("--out", default=None)
    ap.add_argument("--budget-s", type=float, default=300.0)
    ap.add_argument("--pallas", action="store_true", help="jax part: also time the Pallas-Triton port (kernel_nk)")
    ap.add_argument("--shapes", nargs="+", default=None, choices=ORDER, help="jax part: these shapes only")
    ap.add_argument("--pallas-kinds", nargs="+", default=["int8", "int4"],
                    help="jax part with --pallas: int4 also times kernel_nk.int4_matmul_nk and XLA's dequantize + dot")
    ap.add_argument("--kinds", nargs="+", default=["int8", "int4"], help="jax part: the jax-triton kinds to time")
    a = ap.parse_args(argv)
    a.m = a.m or ([1, 16] if a.part == "sweep" else [1, 4, 16])
    a.out = a.out or f"/tmp/triton_small_m_{a.part}.json"
    (sweep if a.part == "sweep" else jax_part)(a)


if __name__ == "__main__":
    main()
