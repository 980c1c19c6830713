"""Quantized matmul on the GPU: every int8 / int4 / fp8 implementation beside XLA's bf16 dot, in one run, at the
Llama-3-8B projection shapes (qkv 4096x6144, o 4096x4096, gate_up 4096x28672, down 14336x4096, lm_head
4096x128256) and M (tokens in the step) in {1, 4, 16, 64, 256, 2048}.

Variants (VARIANTS below; `family` = the weight layout, built once per shape and M):
  bf16                 x @ w, bf16 weights: the baseline every speed-up is relative to
  fp8_w8a8             per-token e4m3 activations x e4m3 [N, K] weights, XLA's fp8 dot (the engine's fp8 path)
  int8_pallas          the Pallas-Triton int8 kernel (kernel.py), default configuration for that M
  int8_convert_kn/_nk  x @ q.astype(bf16) * scale, q [K, N] (the model's layout; = backend 'xla') / [N, K]
  int8_mixed_kn/_nk    lax.dot_general(x bf16, q int8) mixed-type dot, f32 out, * scale
  int8_w8a8_kn/_nk     W8A8 int8: x quantized per token to int8, int8 x int8 -> int32 dot, scales on the output
                       (changes numerics: see err_f; backend 'w8a8' runs the _kn form)
  int4_pallas          the Pallas-Triton int4 kernel, packed uint8 [K/2, N] weights, g128 (the default backend)
  int4_xla_packed      unpack + dequantize to bf16, then dot (backend 'xla' for int4)
  int4n_dequant        native int4 [K, N] (jnp.int4): (q * scale) as the dot's operand prologue, one dot
  int4n_grouped(_mixed)  native int4: per-group partial dots [G, M, N] (q.astype(bf16) | the int4 operand itself),
                       * scale, summed over the groups
Timing: one jitted function calls the op n times (unrolled; n >= the weight copies, ~150 us of device work) on
as many distinct weight copies as exceed twice the 50 MB L2 (weights stream from HBM, as in a model), each call
depending on the previous through one element of x; 8 calls of it are dispatched back to back and timed; time =
median of --reps such runs / (8 n). Reported per row: us, TB/s of quantized bytes (weights + scales + offsets
only: what decode streams), % of the 4.2 TB/s HBM ceiling (ANCHORS.md; the in-process x*2 rate is recorded
too), speed-up vs bf16, and (at M in --check-m) the relative error vs the float32 reference of the variant's own
layout (err_q) and vs the float weights (err_f). At the end: the winners per M and the PATHS table for
jaxinfer/models/quant_paths.py they suggest.

Robustness: every variant is guarded (its error is printed and recorded, the sweep goes on), the JSON is
rewritten after every variant, and a time budget (--budget-s, per process) marks the rest "skipped".
--gpus N (default: all GPUs nvidia-smi lists) runs N worker processes, one per GPU, over the (shape, M) configs
round-robin (each writes kernel-quantized-matmul-part<i>of<N>-<date>.json as it goes), then merges them into
kernel-quantized-matmul-<date>.json.

  python benchmarks/kernels/quantized_matmul.py                # H200: all shapes, all M, every variant
  python benchmarks/kernels/quantized_matmul.py --quick        # CPU smoke: tiny shapes, kernels in interpret mode
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.common import RESULTS_DIR, measure_hbm_bandwidth, write_result  # noqa: E402

NAME = "kernel-quantized-matmul"
HBM_CEILING = 4.2e12         # B/s, ANCHORS.md (HBM ~4.2 TB/s)
L2_BYTES = 50e6
CALL_US, EST_BPS, EST_FLOPS = 150.0, 3e12, 600e12   # unroll each timed call to ~150 us at these estimated rates
MAX_UNROLL, DISPATCHES = 64, 8
GROUP = 128                  # int4 group size benchmarked (the int4-g128 target)
SHAPES = {"gate_up": (4096, 28672), "down": (14336, 4096), "qkv": (4096, 6144), "o": (4096, 4096),
          "lm_head": (4096, 128256)}
M_ORDER = [1, 16, 2048, 256, 4, 64]   # most informative first (the budget cuts the end)


# ---- variants -------------------------------------------------------------------------------------------------
def _families():
    """family -> (float weight w [K, N] f32 -> leaves pytree, quantized-bytes function of the leaves)."""
    from jaxinfer.weights.quantize import quantized_leaves
    from jaxinfer.config import parse_quantization

    i8, i4, f8 = parse_quantization("int8"), parse_quantization(f"int4-g{GROUP}"), parse_quantization("fp8")

    def nbytes(tree):  # int4 counted packed (two a byte), as XLA stores s4 on the GPU
        return sum((x.size + 1) // 2 if x.dtype == jnp.int4 else x.size * x.dtype.itemsize
                   for x in jax.tree.leaves(tree))

    def int8_nk(w):  # (on a GPU the spec's default layout is already [N, K]: ask for the [K, N] one and transpose)
        L = quantized_leaves(w, i8, jnp.bfloat16, layout="kn")
        return {"q": jnp.asarray(L["q"].T), "scale": L["scale"]}

    def int4_native_nk(w):  # q int4 [N, K], scale / offset [N, G]: K contiguous, as int8_nk
        L = quantized_leaves(w, i4, jnp.bfloat16, layout="native")
        return {k: jnp.asarray(v.T) for k, v in L.items()}

    def int4_mosaic_nk(w):  # q int4 [N, K], scale / offset [G, N] (the 'mosaic-int4' backend's leaves)
        L = quantized_leaves(w, i4, jnp.bfloat16, layout="native")
        return {k: jnp.asarray(v.T) if k == "q" else v for k, v in L.items()}

    return {
        "bf16": (lambda w: {"w": w.astype(jnp.bfloat16)}, nbytes),
        "int4_native_nk": (int4_native_nk, nbytes),
        "int4_mosaic_nk": (int4_mosaic_nk, nbytes),
        "int4_packed_nk": (lambda w: quantized_leaves(w, i4, jnp.bfloat16, layout="packed-nk"), nbytes),
        "fp8": (lambda w: quantized_leaves(w, f8, jnp.bfloat16), nbytes),
        "int8_kn": (lambda w: quantized_leaves(w, i8, jnp.bfloat16, layout="kn"), nbytes),
        "int8_nk": (int8_nk, nbytes),
        "int4_packed": (lambda w: quantized_leaves(w, i4, jnp.bfloat16, layout="packed"), nbytes),
        "int4_native": (lambda w: quantized_leaves(w, i4, jnp.bfloat16, layout="native"), nbytes),
    }


def _nk_override(qnk, **kw):
    """kernel_nk.int8_matmul_nk with its default configuration's fields replaced (split_k, block_n, ...)."""
    def op(x, w):
        N, K = w["q"].shape
        cfg = dataclasses.replace(qnk.config_for(x.shape[0], K, N), **kw)
        return qnk.int8_matmul_nk(x, w["q"], w["scale"], cfg=cfg)
    return op


def variants(interpret: bool):
    """name -> (family, op(x, leaves) -> [M, N], reference kind, model path it measures or None)."""
    from pallas_kernels.quantized_matmul import kernel as qk
    from pallas_kernels.quantized_matmul import xla as qx
    from pallas_kernels.quantized_matmul import xla_fused as qf

    from pallas_kernels.quantized_matmul import kernel_nk as qnk
    from pallas_kernels.quantized_matmul import mosaic_int4 as qmi
    from pallas_kernels.quantized_matmul import mosaic_int4_wide as qmw
    from pallas_kernels.quantized_matmul import mosaic_int8 as qm8

    g = GROUP

    def mosaic(target=None, stages=4):  # target None: the kernel's default (TARGET_CTAS, LONG_K_TARGET_CTAS)
        def op(x, w):
            cfg = qmi.default_config(x.shape[0], x.shape[1], w["q"].shape[0], target_ctas=target, max_stages=stages)
            return qmi.int4_matmul_mosaic(x, w["q"], w["scale"], w.get("offset"), cfg=cfg)
        default = (target, stages) == (None, 4)
        return ("int4_mosaic_nk", op, "int4mn", ("int4mn", "mosaic-int4") if default else None)

    def wide(transpose_out=None, **kw):  # the many-token kernel (mosaic_int4_wide.py); kw: default_config's knobs
        def op(x, w):
            cfg = qmw.default_config(x.shape[0], x.shape[1], w["q"].shape[0], **kw)
            if transpose_out is not None:
                cfg = dataclasses.replace(cfg, transpose_out=transpose_out)
            return qmw.int4_matmul_mosaic_wide(x, w["q"], w["scale"], w.get("offset"), cfg=cfg)
        default = not kw and transpose_out is None
        return ("int4_mosaic_nk", op, "int4mn", ("int4mn", "mosaic-int4-wide-nk") if default else None)

    return {
        "bf16": ("bf16", lambda x, w: jnp.dot(x, w["w"], preferred_element_type=jnp.float32).astype(x.dtype),
                 None, None),
        "fp8_w8a8": ("fp8", lambda x, w: qx.fp8_matmul_xla(x, w["q"], w["scale"]), "fp8", None),
        # the fp8 dot's output in f32 (the default before 12-07 h; bf16 since: half the bytes the scaling reads back)
        "fp8_w8a8_f32out": ("fp8", lambda x, w: qx.fp8_matmul_xla(x, w["q"], w["scale"], dot_dtype=jnp.float32),
                            "fp8", None),
        "int8_pallas": ("int8_kn", lambda x, w: qk.int8_matmul(x, w["q"], w["scale"], interpret=interpret),
                        "int8", ("int8", "pallas")),
        "int8_convert_kn": ("int8_kn", lambda x, w: qf.int8_convert_xla(x, w["q"], w["scale"]), "int8",
                            ("int8", "xla")),
        "int8_mixed_kn": ("int8_kn", lambda x, w: qf.int8_mixed_xla(x, w["q"], w["scale"]), "int8",
                          ("int8", "xla-mixed")),
        "int8_w8a8_kn": ("int8_kn", lambda x, w: qf.int8_w8a8_xla(x, w["q"], w["scale"]), "w8a8",
                         ("int8", "w8a8")),
        "int8_w8a8_nk": ("int8_nk", lambda x, w: qf.int8_w8a8_xla(x, w["q"], w["scale"], layout="nk"), "w8a8",
                         ("int8nk", "w8a8-nk")),
        "int8_mixed_nk": ("int8_nk", lambda x, w: qf.int8_mixed_xla(x, w["q"], w["scale"], layout="nk"), "int8",
                          ("int8nk", "mixed-nk")),
        # the engine's int8 small-M kernel (M <= 16, Pallas-Triton) and the Mosaic GPU form of 2026-12-05
        "int8_pallas_nk": ("int8_nk", lambda x, w: qnk.int8_matmul_nk(x, w["q"], w["scale"]), "int8",
                           ("int8nk", "pallas-nk")),
        "int8_mosaic_nk": ("int8_nk", lambda x, w: qm8.int8_matmul_mosaic(x, w["q"], w["scale"]), "int8", None),
        # the Pallas-Triton kernel with the split / BN / stages overridden: on the 1B draft's shapes the default
        # configuration took 12-24 us at M = 1 against 1.4-11 us floors (12-06 g, benchmarks/README.md)
        **{f"int8_pallas_nk_{tag}": ("int8_nk", _nk_override(qnk, **kw), "int8", None)
           for tag, kw in (("s1", dict(split_k=1)), ("s2", dict(split_k=2)), ("s4", dict(split_k=4)),
                           ("bn32", dict(block_n=32)), ("st2", dict(num_stages=2)),
                           ("blocked", dict(exact_rows=False)))},   # 16 partial rows a split below 16 (pre 12-06 i)
        # the many-token Mosaic kernel's int8 form (mosaic_int4_wide.int8_matmul_mosaic_wide, 2026-12-05 c)
        "int8_wide_nk": ("int8_nk", lambda x, w: qmw.int8_matmul_mosaic_wide(x, w["q"], w["scale"]), "int8", None),
        "int8_convert_nk": ("int8_nk", lambda x, w: qf.int8_convert_xla(x, w["q"], w["scale"], layout="nk"),
                            "int8", ("int8nk", "convert-nk")),
        "int4_pallas": ("int4_packed", lambda x, w: qk.int4_matmul(x, w["q"], w["scale"], w["offset"],
                                                                   group_size=g, interpret=interpret),
                        "int4", ("int4", "pallas")),
        "int4n_dequant": ("int4_native", lambda x, w: qf.int4_native_dequant_xla(
            x, w["q"], w["scale"], w.get("offset"), group_size=g), "int4n", ("int4n", "int4-dequant")),
        "int4n_grouped": ("int4_native", lambda x, w: qf.int4_native_grouped_xla(
            x, w["q"], w["scale"], w.get("offset"), group_size=g), "int4n", ("int4n", "int4-grouped")),
        "int4n_grouped_mixed": ("int4_native", lambda x, w: qf.int4_native_grouped_xla(
            x, w["q"], w["scale"], w.get("offset"), group_size=g, mixed=True), "int4n",
            ("int4n", "int4-grouped-mixed")),
        "int4n_dequant_nk": ("int4_native_nk", lambda x, w: _int4_nk_dequant(x, w, g), "int4n", None),
        "int4_xla_packed": ("int4_packed", lambda x, w: qx.int4_matmul_xla(x, w["q"], w["scale"], w["offset"],
                                                                           group_size=g), "int4", ("int4", "xla")),
        # the Mosaic GPU int4 kernel (mosaic_int4.py) at M <= 16, with split / pipeline variants, and the engine's
        # previous int4 decode kernel (kernel_nk's, [N, K/2] packed) as its peer
        "int4_mosaic": mosaic(),
        "int4_mosaic_t512": mosaic(512),
        "int4_mosaic_t2048": mosaic(2048),
        "int4_mosaic_t256": mosaic(256),     # fewer K splits at M = 32..128 (each split writes [N, Mp] f32 partials)
        "int4_mosaic_t128": mosaic(128),
        "int4_mosaic_st2": mosaic(stages=2),
        "int4_mosaic_st8": mosaic(stages=8),
        # the engine's 'mosaic-int4' path above the kernel's M (XLA's dequantize + dot on the same leaves)
        "int4_mosaic_xla": ("int4_mosaic_nk", lambda x, w: qf.int4_native_nk_dequant_xla(
            x, w["q"], w["scale"], w.get("offset"), group_size=g), "int4mn", ("int4mn", "int4-dequant-nk")),
        # the many-token Mosaic int4 kernel (2026-12-05 c) and its tile / row-block / split / stage variants
        # W4A8 ('mosaic-int4-w4a8' from W4A8_MIN_TOKENS): the int4 -> e4m3 pass and XLA's fp8 dot, both timed
        "int4_w4a8_nk": ("int4_mosaic_nk", lambda x, w: qf.int4_native_nk_w4a8_xla(
            x, w["q"], w["scale"], w.get("offset"), group_size=g), "int4mn", ("int4mn", "w4a8-nk")),
        "int4_wide": wide(),                       # 128-token tiles, 2 row blocks, stages for 2 CTAs an SM, y [M, N]
        "int4_wide_t": wide(transpose_out=True),   # the same, explicitly (the default since 2026-12-05 d)
        "int4_wide_yt": wide(transpose_out=False),  # y^T [N, M] for XLA to transpose (the default before 12-05 d)
        "int4_wide_rb1": wide(row_blocks=1),
        "int4_wide_tm64": wide(max_tile_m=64),
        "int4_wide_big": wide(smem_bytes=200 << 10),   # 4 stages, one CTA an SM (fb8401c's default)
        "int4_pallas_nk": ("int4_packed_nk", lambda x, w: qnk.int4_matmul_nk(
            x, w["q"], w["scale"], w["offset"], group_size=g), "int4pnk", ("int4pnk", "pallas-int4-nk")),
    }


def _int4_nk_dequant(x, w, g):
    """Experiment (not an engine path yet): native int4 [N, K] weights, the dequantization (q * scale + offset per
    group along K) as the dot's operand prologue, contracted over the contiguous K."""
    N, K = w["q"].shape
    deq = w["q"].astype(x.dtype).reshape(N, K // g, g) * w["scale"][:, :, None]
    if w.get("offset") is not None:
        deq = deq + w["offset"][:, :, None]
    y = jax.lax.dot_general(x, deq.reshape(N, K), (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    return y.astype(x.dtype)


def reference(kind, fam, x, w):
    from pallas_kernels.quantized_matmul import reference as qr

    f32 = jnp.float32
    if fam == "int4_native_nk":
        w = {k: v.T for k, v in w.items()}
        fam = "int4_native"
    q = w.get("q")
    if fam.endswith("_nk"):  # compare in the [K, N] layout of the references
        q = q.T
    if kind == "int8":
        return qr.int8_matmul_reference(x, q, w["scale"], out_dtype=f32)
    if kind == "w8a8":
        return qr.int8_w8a8_matmul_reference(x, q, w["scale"], out_dtype=f32)
    if kind == "int4":
        return qr.int4_matmul_reference(x, w["q"], w["scale"], w["offset"], group_size=GROUP, out_dtype=f32)
    if kind == "int4mn":
        return qr.int4_native_matmul_reference(x, w["q"].T, w["scale"], w.get("offset"), group_size=GROUP,
                                               out_dtype=f32)
    if kind == "int4pnk":
        return qr.int4_matmul_reference(x, w["q"].T, w["scale"], w["offset"], group_size=GROUP, out_dtype=f32)
    if kind == "int4n":
        return qr.int4_native_matmul_reference(x, w["q"], w["scale"], w.get("offset"), group_size=GROUP,
                                               out_dtype=f32)
    if kind == "fp8":
        return qr.fp8_matmul_reference(x, w["q"], w["scale"], out_dtype=f32)
    return None


# ---- timing ---------------------------------------------------------------------------------------------------
def looped(op, copies: int, n: int):
    """n calls over `copies` weight pytrees; each call's x carries one element of the previous output."""
    @jax.jit
    def run(x, ws):
        out = None
        for i in range(n):
            if out is not None:
                x = x.at[0, 0].add((out[0, 0] * 0).astype(x.dtype))
            out = op(x, ws[i % copies])
        return out
    return run


def time_us(run, args, calls_per_run: int, reps: int, dispatches: int) -> tuple[float, float]:
    jax.block_until_ready(run(*args))                      # compile + warm up
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(dispatches):
            out = run(*args)
        jax.block_until_ready(out)
        ts.append((time.perf_counter() - t0) / (dispatches * calls_per_run) * 1e6)
    return float(np.median(ts)), float(np.min(ts))


def _bytes_in_use():
    from jaxinfer.runner.device_memory import memory_budget

    memory = memory_budget(jax.devices()[0])  # jax's statistics, or the CUDA driver's under the VMM allocator
    return None if memory is None else memory[1]  # CPU: None


def qf_grouped_max() -> int:
    from pallas_kernels.quantized_matmul import xla_fused

    return xla_fused.GROUPED_MAX_BYTES


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


# ---- one process: a list of (shape, M) configs ------------------------------------------------------------------
def run_configs(a, configs, result_name, t_start) -> list[dict]:
    interpret = a.quick or jax.default_backend() == "cpu"
    fams, vars_ = _families(), variants(interpret)
    if a.variants:
        vars_ = {k: v for k, v in vars_.items() if k in a.variants or k == "bf16"}
    hbm_x2 = measure_hbm_bandwidth(0.05, 3) if a.quick else measure_hbm_bandwidth()
    print(f"jax {jax.__version__} on {jax.devices()[0]}; x*2 pass {hbm_x2 / 1e12:.2f} TB/s; ceiling used "
          f"{HBM_CEILING / 1e12:.1f} TB/s", flush=True)
    print(f"{'shape':<8} {'K':>6} {'N':>6} {'M':>5} {'variant':<20} {'us':>8} {'min_us':>8} {'TB/s':>6} {'%HBM':>6} "
          f"{'vs bf16':>8} {'err_q':>8} {'err_f':>7}", flush=True)
    rows = []

    def save():
        write_result(result_name, dict(hbm_x2_TBps=hbm_x2 / 1e12, hbm_ceiling_TBps=HBM_CEILING / 1e12,
                                       group_size=GROUP, reps=a.reps, interpret=interpret,
                                       wall_s=time.perf_counter() - t_start, rows=rows))

    key = jax.random.key(0)
    for sname, K, N, M in configs:
        base_us, cache, exact, refs = None, {}, None, {}
        try:
            kw, kx = jax.random.split(jax.random.fold_in(key, K * 7 + N + M))
            w = 0.02 * jax.random.normal(kw, (K, N), jnp.float32)
            x = jax.random.normal(kx, (M, K), jnp.float32).astype(jnp.bfloat16)
            check = a.quick or M in a.check_m
            if check:
                exact = jnp.dot(x.astype(jnp.float32), w, precision=jax.lax.Precision.HIGHEST)
        except Exception as e:  # e.g. out of memory for the float weight: record, go on
            rows.append(dict(shape=sname, K=K, N=N, M=M, error=f"setup {type(e).__name__}: {str(e)[:400]}"))
            print(f"{sname:<8} {K:>6} {N:>6} {M:>5} setup ERROR {rows[-1]['error'][:300]}", flush=True)
            save()
            continue
        for name, (fam, op, ref_kind, path) in vars_.items():
            row = dict(shape=sname, K=K, N=N, M=M, variant=name, family=fam, path=path)
            if time.perf_counter() - t_start > a.budget_s:
                row["skipped"] = "time budget"
                rows.append(row)
                continue
            try:
                if fam not in cache:
                    make, nbytes = fams[fam]
                    used0 = _bytes_in_use()
                    w0 = jax.block_until_ready(make(w))
                    used1 = _bytes_in_use()
                    qbytes = nbytes(w0)
                    copies = 1 if a.quick else int(min(16, max(2, math.ceil(2 * L2_BYTES / qbytes))))
                    ws = [w0] + [jax.tree.map(jnp.copy, w0) for _ in range(copies - 1)]
                    # allocator-measured bytes of one copy (checks that int4 is stored two a byte); None off GPU
                    dev = None if None in (used0, used1) else used1 - used0
                    cache[fam] = (ws, qbytes, dev)
                ws, qbytes, dev = cache[fam]
                row["device_bytes_one_copy"] = dev
                est_us = max(qbytes / EST_BPS, 2.0 * M * K * N / EST_FLOPS) * 1e6
                n = len(ws) if a.quick else int(min(MAX_UNROLL, max(len(ws), math.ceil(CALL_US / est_us))))
                t0 = time.perf_counter()
                us, us_min = time_us(looped(op, len(ws), n), (x, ws), n, a.reps, 1 if a.quick else DISPATCHES)
                if name == "bf16":
                    base_us = us
                if name.startswith("int4n_grouped") and M * (K // GROUP) * N * 4 > qf_grouped_max():
                    row["note"] = "grouped partials too large: ran the dequant form"
                row.update(us=us, us_min=us_min, variant_wall_s=time.perf_counter() - t0, quantized_bytes=qbytes,
                           copies=len(ws), unroll=n,
                           TBps=qbytes / us / 1e6, pct_hbm=100 * qbytes / (us * 1e-6) / HBM_CEILING,
                           tflops=2.0 * M * K * N / us / 1e6,
                           speedup_vs_bf16=None if base_us is None else base_us / us)
                if check:
                    out = jax.jit(op)(x, ws[0])
                    if ref_kind is not None and (ref_kind, fam) not in refs:
                        refs[(ref_kind, fam)] = reference(ref_kind, fam, x, ws[0])
                    ref = refs.get((ref_kind, fam))
                    row.update(rel_err_vs_quantized_ref=None if ref is None else rel(out, ref),
                               rel_err_vs_float=rel(out, exact))
                eq, ef = row.get("rel_err_vs_quantized_ref"), row.get("rel_err_vs_float")
                print(f"{sname:<8} {K:>6} {N:>6} {M:>5} {name:<20} {us:>8.1f} {us_min:>8.1f} {row['TBps']:>6.2f} "
                      f"{row['pct_hbm']:>5.0f}% {row['speedup_vs_bf16'] or float('nan'):>7.2f}x "
                      f"{eq if eq is not None else float('nan'):>8.1e} "
                      f"{ef if ef is not None else float('nan'):>7.1e}", flush=True)
            except Exception as e:  # one failing variant must not lose the run
                row["error"] = f"{type(e).__name__}: {str(e)[:600]}"
                print(f"{sname:<8} {K:>6} {N:>6} {M:>5} {name:<20} ERROR {row['error'][:300]}", flush=True)
            rows.append(row)
            save()
        del cache, refs, exact
    save()
    return rows


# ---- the suggested table ----------------------------------------------------------------------------------------
def suggest(rows) -> dict:
    """Per M: geomean speed-up vs bf16 over the shapes measured, for each variant the model can run; the winners
    of each layout as quant_paths.PATHS rows, and whether int4 should move to the native layout."""
    from jaxinfer.models.quant_paths import LARGE_WEIGHT

    by = {}
    for r in rows:
        if r.get("speedup_vs_bf16") and r.get("path"):
            lay = r["path"][0]
            if lay == "int8nk":  # the 'xla-nk' backend has one table per weight size class
                lay += "-large" if r["K"] * r["N"] >= LARGE_WEIGHT else "-small"
            by.setdefault(((lay, r["path"][1]), r["M"]), []).append(r["speedup_vs_bf16"])
    geo = {k: float(np.exp(np.mean(np.log(v)))) for k, v in by.items()}
    layouts = {("int8", "auto"): "int8", ("int4", "auto"): "int4", ("int4", "xla-int4"): "int4n",
               ("int8", "xla-nk"): "int8nk-small", ("int8", "xla-nk", "large"): "int8nk-large"}
    out = {"geomean_speedup": {f"{p[0]}:{p[1]}@M={m}": s for (p, m), s in sorted(geo.items())}}
    for table_key, layout in layouts.items():
        ms = sorted({m for (p, m) in geo if p[0] == layout})
        winners = []
        for m in ms:
            cands = {p[1]: s for (p, mm), s in geo.items() if p[0] == layout and mm == m}
            best = max(cands, key=cands.get)
            winners.append((m, best, cands[best]))
        rows_ = []
        for i, (m, best, _) in enumerate(winners):
            if i + 1 < len(winners) and winners[i + 1][1] == best:
                continue
            rows_.append([m if i + 1 < len(winners) else "ANY_M", best])
        out[f"PATHS[{table_key}]"] = dict(rows=rows_, winners=winners)
    # int4 layouts at decode (M <= 16): the mean over M of the best path's geomean, packed vs native
    decode = {}
    for lay in ("int4", "int4n"):
        per_m = [max(s for (p, mm), s in geo.items() if p[0] == lay and mm == m)
                 for m in sorted({m for (p, m) in geo if p[0] == lay and m <= 16})]
        decode[lay] = float(np.mean(per_m)) if per_m else 0.0
    out["int4_decode_best_geomean"] = decode
    out["GPU_DEFAULT[int4]"] = "xla-int4" if decode["int4n"] > decode["int4"] else "auto"
    return out


def print_suggestion(s):
    print("\nsuggested tables (jaxinfer/models/quant_paths.py; geomean speed-up vs bf16 over the shapes):", flush=True)
    for k, v in s.items():
        if k.startswith("PATHS["):
            print(f"  {k} = {v['rows']}   winners (M, path, speed-up): "
                  + ", ".join(f"({m}, {p}, {x:.2f}x)" for m, p, x in v["winners"]), flush=True)
    print(f"  int4 decode (M <= 16) best geomean: {s['int4_decode_best_geomean']} -> GPU_DEFAULT['int4'] = "
          f"{s['GPU_DEFAULT[int4]']!r}", flush=True)
    print("  ('w8a8' rounds the activations to int8 too: check benchmarks/quality.py before making it a default)",
          flush=True)


# ---- driver -----------------------------------------------------------------------------------------------------
def _count_gpus() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
        return max(1, sum(1 for line in out.splitlines() if line.startswith("GPU ")))
    except Exception:
        return 1


def all_configs(a):
    shapes = SHAPES if not a.shapes else {s: SHAPES[s] if s in SHAPES else tuple(map(int, s.lower().split("x")))
                                          for s in a.shapes}
    if a.quick:
        shapes, ms = {"tiny": (256, 128), "tiny_ragged": (384, 48)}, [1, 32]
    else:
        ms = [m for m in M_ORDER if m in a.m] + [m for m in a.m if m not in M_ORDER]
    return [(s, K, N, M) for M in ms for s, (K, N) in shapes.items()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="+", default=None,
                    help=f"names of {sorted(SHAPES)} or KxN (default: all five 8B projections)")
    ap.add_argument("--m", type=int, nargs="+", default=M_ORDER)
    ap.add_argument("--variants", nargs="+", default=None, help="subset of variant names (bf16 always runs)")
    ap.add_argument("--check-m", type=int, nargs="*", default=[1, 2048],
                    help="M values at which the errors vs the references are computed")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=270.0, help="per process: skip what is left past this")
    ap.add_argument("--gpus", default="auto", help="worker processes, one per GPU ('auto': nvidia-smi -L)")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--quick", "--smoke", action="store_true", dest="quick",
                    help="CPU smoke test: tiny shapes, kernels in interpret mode")
    from benchmarks.common import add_profile_arg, start_profile
    add_profile_arg(ap)
    a = ap.parse_args()
    t_start = time.perf_counter()
    configs = all_configs(a)
    gpus = 1 if (a.quick or a.profile) else (_count_gpus() if a.gpus == "auto" else int(a.gpus))
    if a.worker is not None:                                  # one worker of a multi-GPU run
        run_configs(a, configs[a.worker::gpus], f"{NAME}-part{a.worker}of{gpus}", t_start)
        return
    if gpus <= 1:
        start_profile(a.profile)
        rows = run_configs(a, configs, NAME, t_start)
    else:
        rows = run_workers(a, gpus, t_start)
    s = suggest(rows)
    print_suggestion(s)
    path = write_result(NAME, dict(hbm_ceiling_TBps=HBM_CEILING / 1e12, group_size=GROUP, gpus=gpus,
                                   reps=a.reps, wall_s=time.perf_counter() - t_start, suggestion=s, rows=rows))
    print(f"wrote {path} in {time.perf_counter() - t_start:.0f} s", flush=True)


def run_workers(a, gpus: int, t_start) -> list[dict]:
    """One process per GPU (CUDA_VISIBLE_DEVICES), configs round-robin; the parent initialises no GPU until they
    are done, then merges their part files (each rewritten after every variant, so a killed worker keeps its
    rows)."""
    import glob

    argv = list(sys.argv[1:])
    # write_result names them <NAME>-part<i>of<N>[-cpu]-<date>.json; globbing keeps the parent off jax's backend
    parts = [os.path.join(RESULTS_DIR, f"{NAME}-part{i}of{gpus}-*.json") for i in range(gpus)]
    for pattern in parts:  # a stale part file of an earlier run must not be merged
        for old in glob.glob(pattern):
            os.remove(old)
    procs = []
    for i in range(gpus):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(i))
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), *argv, "--gpus", str(gpus),
                                       "--worker", str(i)], env=env))
    deadline = time.time() + a.budget_s + 60
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            print(f"worker pid {p.pid} past the budget: killed (its part file keeps what it measured)", flush=True)
            p.kill()
            p.wait()
    rows = []
    for i, pattern in enumerate(parts):
        try:
            (part,) = glob.glob(pattern)
            with open(part) as f:
                rows += json.load(f)["rows"]
        except Exception as e:
            print(f"worker {i}: no readable part file {pattern} ({type(e).__name__}: {e})", flush=True)
    print(f"merged {len(rows)} rows from {gpus} workers in {time.perf_counter() - t_start:.0f} s", flush=True)
    return rows


if __name__ == "__main__":
    main()
