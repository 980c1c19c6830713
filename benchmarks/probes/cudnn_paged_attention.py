"""Is cuDNN's paged attention the decode (and prefill) attention backend to move to? (issue 17 items 3 / 4)

The Pallas-Triton kernel (pallas_kernels/paged_attention/kernel.py) streams 2.15-3.13 TB/s of KV at batch >= 64 on
the H200 (2026-12-01: 256 x 512 250 us = 2.15 TB/s, 64 x 4k 2.79), short of the 3.2 TB/s target after two rounds of
tuning, and its prefill path is 1.3-2.9x cuDNN's dense attention. The method says: measure another backend. cuDNN's
fused attention takes a paged KV cache (JAX's private `_dot_product_attention_fwd` with page tables; the public
`jax.nn.dot_product_attention` does not pass them), on the engine's own pool layout [num_pages, page_size, KVH, D].

Per (batch, context), decode (one query token a sequence, bf16, 32 q / 8 KV heads, D 128, page 16 or
--page-size), one process:
  kernel      the engine's Pallas kernel with the engine's block and split rules (the figure to beat), and 128-key
              blocks / 1 split
  cudnn_gqa   cuDNN paged, q [B, 1, 32, D] against 8 KV heads (GQA inside cuDNN)
  cudnn_fold  cuDNN paged, the 4 query heads of a KV head folded into the query length: q [B, 4, 8, D], 8 heads
              (each KV head read once per sequence, whatever cuDNN does for GQA)
  cudnn_gqa_bnth  the GQA form on head-major pools [num_pages, KVH, page_size, D] (layout BNTH: each page's head
              one contiguous block; the engine's pools are token-major): would another pool layout stream faster?
  cudnn_gqa_dense the GQA form on unpaged K / V [B, S, KVH, D] (the pages gathered outside the timing): what
              paging costs cuDNN
  cudnn_engine  the engine's form (cudnn_paged.cudnn_paged_attention: the fold, one row a token, with the jnp
              around it: the per-token page tables and KV lengths from the step's metadata)
each as `inner` dependent calls in one program (benchmarks/kernels/paged_attention.measure), rel. error of each
against the kernel's output. Then prefill with cached context (a chunk of C tokens after P cached, causal): the
cuDNN paged call's output against both alignments of the causal mask (bottom-right is what a chunk after its
context needs), and its time against cuDNN's dense attention on the same problem and the Pallas kernel.

jax's public check (check_layout, not called by the private fwd) wants a pool of exactly batch x table-width pages;
the probe passes the engine's own pool (more pages, page 0 reserved) to see whether cuDNN itself needs that, and a
table 4x wider than the sequences (the engine's tables are as wide as max_model_len) to see what width costs.

  python benchmarks/probes/cudnn_paged_attention.py [--configs 64x512 256x512 64x4096 256x4096] [--tag T]
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
import numpy as np  # noqa: E402

from benchmarks.common import measure_hbm_bandwidth, write_result  # noqa: E402
from benchmarks.kernels import paged_attention as pa  # noqa: E402
from jaxinfer.models.attention import _pages_per_block  # noqa: E402
from pallas_kernels.paged_attention.cudnn_paged import cudnn_paged_attention, cudnn_sdpa  # noqa: E402

H, KVH, D, PS, G = pa.H, pa.KVH, pa.D, pa.PS, pa.H // pa.KVH


def cudnn_api():
    """The cuDNN version, or a string saying why cuDNN cannot run here."""
    try:
        from jax._src.cudnn import fused_attention_stablehlo as fa
        return fa.check_cudnn_version()
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"


def decode_config(api, batch: int, ctx: int, a, hbm: float, sms: int) -> list[dict]:
    pps = math.ceil((ctx + 1) / PS)
    hbs, page_lists, num_pages = pa.host_batches(batch, ctx)  # the kernel's pool: page 0 reserved, as the engine's
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    kp, vp = pa.random_pool(k1, num_pages), pa.random_pool(k2, num_pages)
    hb = hbs["static"][0]
    q = jax.random.normal(k3, (hb.bucket.num_tokens, H, D), pa.DTYPE)
    md = pa.meta(hb)
    pt = jnp.asarray(page_lists[:, None, :, None])  # [B, 1, pps, 1]
    # the engine's table is wider than the longest sequence: the same pages, padded with page 0 to 4x the width
    pt_wide = jnp.asarray(np.pad(page_lists, ((0, 0), (0, 3 * pps)))[:, None, :, None])
    ones, kvl = jnp.ones((batch,), jnp.int32), jnp.full((batch,), ctx + 1, jnp.int32)
    scale = D ** -0.5
    nbytes = pa.kv_bytes(batch, ctx)
    rows, first = [], {}

    def timed(name, fn, args):
        row = dict(batch=batch, context=ctx, impl=name, kv_bytes=nbytes)
        try:
            m, out = pa.measure(fn, args, pa.inner_for("kernel", nbytes, a.inner), a.reps, a.warmup)
            row.update(m, tbps=nbytes / (m["us"] * 1e-6) / 1e12, pct_hbm=100 * nbytes / (m["us"] * 1e-6) / hbm)
            first[name] = out
            if "kernel_engine" in first and name != "kernel_engine":
                row["rel_err_vs_kernel"] = pa.rel_norm(out, first["kernel_engine"], batch)
        except Exception as e:  # noqa: BLE001  (one failing variant must not lose the run)
            row["error"] = f"{type(e).__name__}: {str(e)[:1500]}"
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
        rows.append(row)

    ks = pa.engine_splits(batch, sms)
    # the engine's blocks: 64 keys (models/attention._pages_per_block; before 12-07 d this row took 4 pages at any
    # page size); the second row 128-key blocks without a split (8 pages at page 16)
    timed("kernel_engine", pa._kernel_fn(_pages_per_block(PS), ks, scale, False), (q, kp, vp, *md))
    p128 = max(1, 128 // PS)
    timed(f"kernel_p{p128}_s1", pa._kernel_fn(p128, 1, scale, False), (q, kp, vp, *md))
    if isinstance(api, str):
        rows.append(dict(batch=batch, context=ctx, impl="cudnn", error=api))
        return rows

    def gqa(x, k, v, pt, ql, kl):  # x [T, H, D]: rows < batch are the sequences' tokens
        o = cudnn_sdpa(x[:batch].reshape(batch, 1, H, D), k, v, ql, kl, pt, scale=scale)
        return jnp.zeros_like(x).at[:batch].set(o.reshape(batch, H, D).astype(x.dtype))

    def fold(x, k, v, pt, ql, kl):  # the G query heads of a KV head as G query rows of one head
        qf = x[:batch].reshape(batch, KVH, G, D).transpose(0, 2, 1, 3)  # [B, G, KVH, D]
        o = cudnn_sdpa(qf, k, v, ql * G, kl, pt, scale=scale)       # [B, G, KVH, D]
        o = o.transpose(0, 2, 1, 3).reshape(batch, H, D)
        return jnp.zeros_like(x).at[:batch].set(o.astype(x.dtype))

    timed("cudnn_engine", lambda x, k, v, *m: cudnn_paged_attention(x, k, v, *m, sm_scale=scale), (q, kp, vp, *md))
    timed("cudnn_gqa", gqa, (q, kp, vp, pt, ones, kvl))
    timed("cudnn_fold", fold, (q, kp, vp, pt, ones, kvl))

    def gqa_bnth(x, k, v, pt, ql, kl):  # head-major pools [num_pages, KVH, PS, D]: each (page, head) contiguous
        o = cudnn_sdpa(x[:batch].reshape(batch, H, 1, D), k, v, ql, kl, pt, scale=scale, layout="BNTH")
        return jnp.zeros_like(x).at[:batch].set(o.reshape(batch, H, D).astype(x.dtype))

    def gqa_dense(x, k, v, ql, kl):  # no pages: K / V [B, S, KVH, D] per sequence (cuDNN's unpaged best case)
        o = cudnn_sdpa(x[:batch].reshape(batch, 1, H, D), k, v, ql, kl, None, scale=scale)
        return jnp.zeros_like(x).at[:batch].set(o.reshape(batch, H, D).astype(x.dtype))

    kp_t, vp_t = jnp.swapaxes(kp, 1, 2), jnp.swapaxes(vp, 1, 2)  # (outside the timing, as a pool layout would be)
    timed("cudnn_gqa_bnth", gqa_bnth, (q, kp_t, vp_t, pt, ones, kvl))
    del kp_t, vp_t
    dk = kp[jnp.asarray(page_lists)].reshape(batch, pps * PS, KVH, D)
    dv = vp[jnp.asarray(page_lists)].reshape(batch, pps * PS, KVH, D)
    timed("cudnn_gqa_dense", gqa_dense, (q, dk, dv, ones, kvl))
    del dk, dv
    timed("cudnn_fold_wide_table", fold, (q, kp, vp, pt_wide, ones, kvl))
    if any("error" in r for r in rows if r["impl"].startswith("cudnn")):  # jax's public contract: B x W pages
        timed("cudnn_fold_exact_pool", fold, (q, kp[1:], vp[1:], pt - 1, ones, kvl))
    return rows


def prefill_check(api, a) -> list[dict]:
    """A chunk of C tokens after P cached ones, B sequences, causal, through the paged cuDNN call: its error
    against a float32 reference with the mask aligned bottom-right (query i sees keys <= P + i) and top-left
    (keys <= i), and its time against cuDNN dense on the same problem and the Pallas kernel (engine metadata)."""
    rows = []
    if isinstance(api, str):
        return [dict(prefill="cudnn", error=api)]
    for B, P, C in a.prefill:
        S = P + C
        pps = math.ceil(S / PS)
        num_pages = B * pps
        k1, k2, k3 = jax.random.split(jax.random.key(1), 3)
        kp, vp = pa.random_pool(k1, num_pages + 1), pa.random_pool(k2, num_pages + 1)  # page 0: the engine's spare
        perm = 1 + np.random.default_rng(0).permutation(num_pages).astype(np.int32).reshape(B, pps)
        pt = jnp.asarray(perm[:, None, :, None])
        q = jax.random.normal(k3, (B, C, H, D), pa.DTYPE)
        scale = D ** -0.5
        ql, kl = jnp.full((B,), C, jnp.int32), jnp.full((B,), S, jnp.int32)
        dense_k = kp[perm].reshape(B, pps * PS, KVH, D)[:, :S]
        dense_v = vp[perm].reshape(B, pps * PS, KVH, D)[:, :S]
        row = dict(prefill=f"{B}x{C} after {P}")
        try:
            out = jax.jit(lambda q, k, v, pt: cudnn_sdpa(q, k, v, ql, kl, pt, scale=scale, causal=True))(
                q, kp, vp, pt)
            kf = jnp.repeat(dense_k.astype(jnp.float32), G, axis=2)
            vf = jnp.repeat(dense_v.astype(jnp.float32), G, axis=2)
            s = jnp.einsum("bqhd,bkhd->bhqk", q.astype(jnp.float32), kf) * scale
            qi, ki = jnp.arange(C)[:, None], jnp.arange(S)[None, :]
            for name, mask in (("bottom_right", ki <= P + qi), ("top_left", ki <= qi)):
                ref = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(jnp.where(mask, s, -jnp.inf), -1), vf)
                row[f"rel_err_{name}"] = float(jnp.linalg.norm(out.astype(jnp.float32) - ref) / jnp.linalg.norm(ref))

            def t(fn, *args):
                f = jax.jit(fn)
                jax.block_until_ready(f(*args))
                ts = []
                for _ in range(a.reps * 4):
                    t0 = time.perf_counter()
                    jax.block_until_ready(f(*args))
                    ts.append(time.perf_counter() - t0)
                return float(np.median(ts)) * 1e6
            row["paged_us"] = t(lambda q, k, v, pt: cudnn_sdpa(q, k, v, ql, kl, pt, scale=scale, causal=True),
                                q, kp, vp, pt)
            row["dense_us"] = t(lambda q, k, v: cudnn_sdpa(q, k, v, ql, kl, None, scale=scale, causal=True),
                                q, dense_k, dense_v)
            if P == 0:
                row["public_dense_causal_us"] = t(lambda q, k, v: jax.nn.dot_product_attention(
                    q, k, v, scale=scale, is_causal=True, implementation="cudnn"), q, dense_k, dense_v)
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {str(e)[:1500]}"
        print(row, flush=True)
        rows.append(row)
    return rows


def main():
    global PS
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", nargs="+", default=["256x512", "64x512", "64x4096", "256x4096", "16x4096", "1x4096"])
    ap.add_argument("--prefill", nargs="*", default=["2x0x512", "2x512x512", "4x0x2048", "2x2048x2048"],
                    help="BxPxC: B sequences, a C-token chunk after P cached tokens")
    ap.add_argument("--inner", type=int, default=10)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--page-size", type=int, default=PS,
                    help="tokens a KV page, the kernel's and cuDNN's pools alike (the engine's page_size; default 16)")
    ap.add_argument("--tag", default="")
    a = ap.parse_args()
    PS = pa.PS = a.page_size  # (read at call time by this module and by the kernel benchmark's pools and tables)
    a.prefill = [tuple(int(x) for x in s.split("x")) for s in a.prefill]
    t0 = time.perf_counter()
    api = cudnn_api()
    hbm = measure_hbm_bandwidth()
    sms = pa.device_num_sms()
    print(f"device {jax.devices()[0].device_kind}, jax {jax.__version__}, HBM x*2 {hbm / 1e12:.2f} TB/s, "
          f"cudnn {api}, page size {PS}", flush=True)
    rows = []
    for c in a.configs:
        b, ctx = (int(x) for x in c.split("x"))
        rows += decode_config(api, b, ctx, a, hbm, sms)
    rows += prefill_check(api, a)
    write_result("cudnn-paged-attention" + (f"-{a.tag}" if a.tag else ""),
                 dict(hbm_ceiling_gbps=hbm / 1e9, page_size=PS, rows=rows, wall_s=time.perf_counter() - t0))


if __name__ == "__main__":
    main()
