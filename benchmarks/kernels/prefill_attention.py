"""Prefill attention: the Pallas ragged paged attention kernel on a prefill chunk vs cuDNN flash attention on the
equivalent dense problem, on the GPU.

Llama-3-8B attention shape (32 q heads / 8 KV heads / head_dim 128, bf16, page 16). One sequence per step whose
whole prompt of `chunk` tokens is one chunk (context 0, causal), chunks {512, 1024, 2048, 4096}. For each chunk,
in one process:
  * the kernel (pages per loop step 1 / 4 / 8), reading K/V from shuffled pages through the page table that `pack`
    builds with the engine's ladder settings;
  * (GPU, `--triton V..`) the plain Triton kernel (triton_prefill.prefill_attention: unmasked blocks below the
    tile's diagonal, exp2, BLOCK_N keys a step gathered through the page table) on the same pages and metadata;
  * (GPU, `--cudnn-seq R..`) the sequence form (cudnn_prefill_forms.cudnn_sequence_attention: the chunk in cuDNN
    rows of R tokens, 0 = one row; a row's context part, the rows before it, paged without a mask, its own keys
    dense and causal, merged by log-sum-exp);
  * (GPU) the cuDNN tile form (`--cudnn-tiles`: cudnn_prefill_forms.cudnn_tile_attention, one cuDNN row a query
    tile on the same pages, the tile's own keys in jnp, merged by log-sum-exp);
  * `jax.nn.dot_product_attention(..., is_causal=True, implementation="cudnn")` on dense [1, chunk, heads, 128]
    arrays holding the same K/V (GQA handled by cuDNN), and the XLA implementation as a second peer;
  * time = median of `--reps` timed runs of a jitted scan of `--inner` dependent calls, / inner;
  * FLOP rate = causal attention FLOPs (2 matmuls x 2 x chunk^2 / 2 x heads x head_dim) / time, beside the bf16
    matmul rate measured first (an 8192^3 XLA dot);
  * every output vs a float32 dense reference (relative Frobenius norm).
Target (issue 4): the kernel within 1.25x of cuDNN. Results: benchmarks/results/kernel-prefill-attention-<date>.json.

  python benchmarks/kernels/prefill_attention.py [--chunk 512 1024 2048 4096]
"""
from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.common import add_profile_arg, measure_matmul_rate, start_profile, write_result  # noqa: E402
from benchmarks.kernels.paged_attention import measure, rel_norm  # noqa: E402
from jaxinfer.outputs import SeqInput  # noqa: E402
from jaxinfer.runner.batch import pack  # noqa: E402
from jaxinfer.runner.buckets import BucketLadder  # noqa: E402
from pallas_kernels.paged_attention.cudnn_prefill_forms import (cudnn_sequence_attention,  # noqa: E402
                                                               cudnn_tile_attention)
from pallas_kernels.paged_attention.kernel import ragged_paged_attention  # noqa: E402
from pallas_kernels.paged_attention import triton_prefill  # noqa: E402

H, KVH, D, PS = 32, 8, 128, 16
DTYPE = jnp.bfloat16


def build(chunk: int, seed: int = 0, query_tile: int = 16):
    """Dense q/k/v [chunk, heads, D] and the same K/V scattered over shuffled pages + the packed prefill step
    (tiles of `query_tile` tokens: the engine's KernelConfig.query_tile of large buckets)."""
    rng = np.random.default_rng(seed)
    n_pages = math.ceil(chunk / PS)
    perm = rng.permutation(np.arange(1, n_pages + 1))  # page 0 stays the engine's reserved page
    seq = SeqInput(token_ids=[1] * chunk, start_pos=0, page_table=perm.tolist())
    ladder = BucketLadder.build(max_num_batched_tokens=max(chunk, 16), max_num_seqs=16, max_model_len=chunk + PS,
                                page_size=PS, query_tile=query_tile, kv_chunk_pages=min(128, n_pages + 1))
    hb = pack([seq], ladder.pick(chunk, 1), PS)
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(k1, (chunk, H, D), DTYPE)
    k = jax.random.normal(k2, (chunk, KVH, D), DTYPE)
    v = jax.random.normal(k3, (chunk, KVH, D), DTYPE)
    pages_k = jnp.zeros((n_pages + 1, PS, KVH, D), DTYPE)
    pages_v = jnp.zeros_like(pages_k)
    slot_pages = jnp.asarray(perm)[jnp.arange(chunk) // PS]
    pages_k = pages_k.at[slot_pages, jnp.arange(chunk) % PS].set(k)
    pages_v = pages_v.at[slot_pages, jnp.arange(chunk) % PS].set(v)
    q_pad = jnp.zeros((hb.bucket.num_tokens, H, D), DTYPE).at[:chunk].set(q)
    return q, k, v, q_pad, pages_k, pages_v, hb


def tiled(chunk: int, query_tile: int):
    """(padded q, the kernel's metadata arrays, the packed step) of `build` with query_tile-token tiles."""
    _, _, _, q_pad, _, _, hb = build(chunk, query_tile=query_tile)
    md = tuple(jnp.asarray(hb.arrays[n]) for n in ("positions", "tile_tokens", "tile_seq", "tile_kv_len",
                                                   "page_tables"))
    return q_pad, md, hb


def dense_reference(q, k, v):
    """float32 causal GQA attention: [T, H, D] x [T, KVH, D] -> [T, H, D]."""
    g = H // KVH
    qf = q.astype(jnp.float32).reshape(q.shape[0], KVH, g, D)
    s = jnp.einsum("tkgd,skd->kgts", qf, k.astype(jnp.float32)) * D ** -0.5
    T = q.shape[0]
    s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -jnp.inf)
    o = jnp.einsum("kgts,skd->tkgd", jax.nn.softmax(s, axis=-1), v.astype(jnp.float32))
    return o.reshape(T, H, D)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunk", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    ap.add_argument("--inner", type=int, default=10)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--variants", nargs="+", default=["16:4:4", "16:8:4", "32:4:4", "32:4:8", "64:4:8", "64:8:8"],
                    help="kernel variants query_tile:pages_per_block:num_warps[:split] (R = query_tile x 4 q heads "
                         "rows per program for the 8B shape; split: split_causal, unmasked blocks below the diagonal)")
    ap.add_argument("--triton", nargs="*", default=["16:64:4:2", "16:64:8:3", "32:64:8:2", "32:64:8:3", "32:128:8:2"],
                    help="GPU (triton + jax-triton): variants of the Triton kernel query_tile:block_n:num_warps:"
                         "num_stages")
    ap.add_argument("--cudnn-tiles", type=int, nargs="*", default=[16, 64],
                    help="GPU: query tiles of the cuDNN tile form (cudnn_prefill_forms.cudnn_tile_attention) to "
                         "time beside the kernel")
    ap.add_argument("--cudnn-seq", type=int, nargs="*", default=[0, 512],
                    help="GPU: also the sequence form (cudnn_prefill_forms.cudnn_sequence_attention) with the chunk "
                         "in rows of these many tokens (0: the whole chunk one row; a row's context: the rows before)")
    ap.add_argument("--interpret", action="store_true", help="kernel in interpret mode (CPU smoke test only)")
    add_profile_arg(ap)
    a = ap.parse_args()
    start_profile(a.profile)
    t_start = time.perf_counter()
    on_gpu = jax.default_backend() == "gpu"
    rate = measure_matmul_rate()
    print(f"jax {jax.__version__} on {jax.devices()[0]}; bf16 matmul rate {rate / 1e12:.0f} TFLOP/s", flush=True)
    print(f"{'chunk':>5} {'impl':<14} {'us':>9} {'TFLOP/s':>8} {'%mm':>6} {'x cudnn':>8} {'rel_err':>9}", flush=True)
    rows = []
    sm_scale = D ** -0.5
    for chunk in a.chunk:
        if time.perf_counter() - t_start > a.budget_s:
            rows.append(dict(chunk=chunk, skipped="time budget"))
            print(f"{chunk:>5} skipped: time budget", flush=True)
            continue
        q, k, v, q_pad, kp, vp, hb = build(chunk)
        ref = dense_reference(q, k, v)
        flops = 4 * (chunk * (chunk + 1) / 2) * H * D
        impls, buckets = {}, {}
        for var in a.variants:
            qt, ppb, nw = (int(x) for x in var.split(":")[:3])
            split = var.endswith(":split")
            qp, md, hbv = tiled(chunk, qt)
            name = f"kernel_q{qt}_p{ppb}_w{nw}" + ("_split" if split else "")
            buckets[name] = str(hbv.bucket)
            impls[name] = ((qp, kp, vp, *md), functools.partial(
                ragged_paged_attention, sm_scale=sm_scale, pages_per_block=ppb, num_warps=nw, interpret=a.interpret,
                split_causal=split))
        for var in (a.triton if triton_prefill.usable() else []):
            qt, bn, nw, ns = (int(x) for x in var.split(":"))
            qp, md, hbv = tiled(chunk, qt)
            name = f"triton_q{qt}_n{bn}_w{nw}_s{ns}"
            buckets[name] = str(hbv.bucket)
            fn = functools.partial(triton_prefill.prefill_attention, sm_scale=sm_scale, block_n=bn, num_warps=nw,
                                   num_stages=ns)
            impls[name] = ((qp, kp, vp, *md), fn)
        for qt in (a.cudnn_tiles if on_gpu else []):  # the engine's A/B form: one cuDNN row a query tile
            qp, md, hbv = tiled(chunk, qt)
            name = f"cudnn_tiles_q{qt}"
            buckets[name] = str(hbv.bucket)
            impls[name] = ((qp, kp, vp, *md), lambda x, kk, vv, *m: cudnn_tile_attention(x, kk, vv, *m,
                                                                                         sm_scale=sm_scale))
        for rl in (a.cudnn_seq if on_gpu else []):  # the sequence form, the chunk in rows of rl tokens (0: one)
            rl = rl or chunk
            if rl > chunk:
                continue
            nr = -(-chunk // rl)   # row r: tokens [r rl, (r + 1) rl), context r rl (the rows before it)
            toks = np.arange(nr * rl).reshape(nr, rl)
            srows = (jnp.asarray(np.where(toks < chunk, toks, q_pad.shape[0]), jnp.int32), jnp.zeros((nr,), jnp.int32),
                    jnp.asarray(np.arange(nr) * rl, jnp.int32))
            name = f"cudnn_seq_r{rl}"
            buckets[name] = str(hb.bucket)
            impls[name] = ((q_pad, kp, vp, *srows, jnp.asarray(hb.arrays["page_tables"])),
                           lambda x, kk, vv, *m: cudnn_sequence_attention(x, kk, vv, *m, sm_scale=sm_scale))
        peers = ["cudnn", "xla"] if on_gpu else ["xla"]
        for impl in peers:
            impls[impl] = ((q[None], k[None], v[None]), lambda x, kk, vv, impl=impl: jax.nn.dot_product_attention(
                x, kk, vv, is_causal=True, scale=sm_scale, implementation=impl))
        res = {}
        for name, (args, fn) in impls.items():
            row = dict(chunk=chunk, impl=name, bucket=buckets.get(name))
            try:
                timing, first = measure(fn, args, a.inner, a.reps, warmup=2)
                us = timing["us"]
                out = first[0] if name in ("cudnn", "xla") else first
                row.update(us=us, tflops=flops / (us * 1e-6) / 1e12, pct_matmul=100 * flops / (us * 1e-6) / rate,
                           rel_err_vs_f32=rel_norm(out, ref, chunk))
            except Exception as e:  # one failing variant must not lose the run
                row["error"] = f"{type(e).__name__}: {str(e)[:600]}"
            res[name] = row
        base = res.get("cudnn", {}).get("us")
        for row in res.values():
            if "error" in row:
                print(f"{chunk:>5} {row['impl']:<14} ERROR {row['error'][:300]}", flush=True)
                continue
            row["x_cudnn"] = row["us"] / base if base else None
            print(f"{chunk:>5} {row['impl']:<14} {row['us']:>9.1f} {row['tflops']:>8.1f} {row['pct_matmul']:>5.1f}% "
                  f"{row['x_cudnn'] or float('nan'):>8.2f} {row['rel_err_vs_f32']:>9.2e}", flush=True)
            rows.append(row)
    path = write_result("kernel-prefill-attention", {
        "shape": dict(heads=H, kv_heads=KVH, head_dim=D, page_size=PS, dtype=jnp.dtype(DTYPE).name),
        "matmul_tflops": rate / 1e12, "inner": a.inner, "reps": a.reps, "interpret": a.interpret,
        "target": "kernel within 1.25x of cuDNN", "wall_s": time.perf_counter() - t_start, "rows": rows})
    print(f"wrote {path} in {time.perf_counter() - t_start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
