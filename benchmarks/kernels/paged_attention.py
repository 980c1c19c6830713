"""Decode attention: the Pallas ragged paged attention kernel vs the jnp reference, on the GPU.

Llama-3-8B attention shape (32 q heads / 8 KV heads / head_dim 128, bf16, page 16), decode batches
{1, 16, 64} x context {512, 2048, 4096}, metadata built by `pack` + `BucketLadder` with the engine's default
ladder settings. For each config, in one process:
  * the kernel in a few variants (pages per loop step, split-K), the reference with static_loop=True
    (the engine's GPU setting, kv_chunk_pages 128) and static_loop=False (while loop, kv_chunk_pages 16);
  * time = median over `--reps` timed runs of a jitted scan of `--inner` dependent calls (the output is the
    next call's q, so nothing is hoisted and host dispatch is amortised), divided by `--inner`;
  * KV bandwidth = bytes of K + V owned by the sequences (batch x (context + 1) tokens) / time, and its
    fraction of the HBM ceiling measured first (an XLA x * 2 pass over 2 GiB);
  * the kernel's output vs the reference (relative Frobenius norm over the real tokens).
Results print as a table and go to benchmarks/results/kernel-paged-attention-<date>.json.

  python benchmarks/kernels/paged_attention.py [--batch 1 16 64] [--context 512 2048 4096]
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
from jaxinfer.runner.batch import SeqInput, pack  # noqa: E402
from jaxinfer.runner.buckets import BucketLadder  # noqa: E402
from pallas_kernels.paged_attention.kernel import ragged_paged_attention  # noqa: E402
from pallas_kernels.paged_attention.reference import ragged_paged_attention_reference  # noqa: E402

H, KVH, D, PS = 32, 8, 128, 16
DTYPE = jnp.bfloat16
MAX_NUM_SEQS, MAX_BATCHED = 256, 2048  # the engine's defaults (config.py): decide the decode bucket
KV_BYTES_LIMIT = 8e9


def num_sms() -> int:
    return int(getattr(jax.devices()[0], "core_count", 0) or 132)


def build(batch: int, ctx: int, seed: int = 0):
    """A decode step of `batch` sequences with `ctx` cached tokens each (shuffled pages), pools filled.

    Returns q, k_pages, v_pages and the packed batches for the two reference settings (static loop with
    kv_chunk_pages 128, the engine's GPU default; while loop with 16): the table width differs between them."""
    rng = np.random.default_rng(seed)
    pages_per_seq = math.ceil((ctx + 1) / PS)
    num_pages = batch * pages_per_seq + 1
    perm = rng.permutation(np.arange(1, num_pages))
    seqs = [SeqInput(token_ids=[1], start_pos=ctx, page_table=perm[i * pages_per_seq:(i + 1) * pages_per_seq].tolist())
            for i in range(batch)]
    mml = ctx + PS
    hbs = {}
    for loop, chunk in (("static", 128), ("while", 16)):
        chunk = min(chunk, math.ceil(mml / PS))
        ladder = BucketLadder.build(max_num_batched_tokens=MAX_BATCHED, max_num_seqs=MAX_NUM_SEQS, max_model_len=mml,
                                    page_size=PS, query_tile=16, kv_chunk_pages=chunk)
        hbs[loop] = (pack(seqs, ladder.pick(batch, batch), PS), chunk)
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    shape = (num_pages, PS, KVH, D)
    kp = jax.random.normal(k1, shape, DTYPE)
    vp = jax.random.normal(k2, shape, DTYPE)
    q = jax.random.normal(k3, (hbs["static"][0].bucket.num_tokens, H, D), DTYPE)
    return q, kp, vp, hbs


def meta(hb):
    a = hb.arrays
    return tuple(jnp.asarray(a[n]) for n in ("positions", "tile_tokens", "tile_seq", "tile_kv_len", "page_tables"))


def looped(fn, inner):
    """jit: `inner` dependent calls (each call's q is the previous call's output, so nothing is hoisted and the
    host dispatch is amortised). Returns (last output, first output); the first is checked against the reference."""
    @jax.jit
    def run(q, kp, vp, *md):
        first = fn(q, kp, vp, *md).astype(q.dtype)

        def body(x, _):
            return fn(x, kp, vp, *md).astype(x.dtype), None
        x, _ = jax.lax.scan(body, first, None, length=inner - 1)
        return x, first
    return run


def time_us(run, args, inner, reps, warmup=2):
    for _ in range(warmup):
        out = run(*args)
    jax.block_until_ready(out)
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(run(*args))
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts)) / inner * 1e6, out[1]


def rel_norm(x, y, n):
    x = np.asarray(x[:n], np.float32)
    y = np.asarray(y[:n], np.float32)
    return float(np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-30))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--context", type=int, nargs="+", default=[2048, 4096, 512],
                    help="outer loop, most informative first (the time budget cuts from the end)")
    ap.add_argument("--inner", type=int, default=10, help="dependent calls per timed run")
    ap.add_argument("--reps", type=int, default=5, help="timed runs (median)")
    ap.add_argument("--budget-s", type=float, default=170.0, help="skip the remaining configs past this time")
    ap.add_argument("--interpret", action="store_true", help="kernel in interpret mode (CPU smoke test only)")
    ap.add_argument("--hbm-gib", type=float, default=2.0)
    from benchmarks.common import add_profile_arg, start_profile
    add_profile_arg(ap)
    a = ap.parse_args()
    start_profile(a.profile)
    t_start = time.perf_counter()
    print(f"jax {jax.__version__} on {jax.devices()[0]} ({num_sms()} SMs)", flush=True)
    hbm = measure_hbm_bandwidth(a.hbm_gib)
    print(f"HBM ceiling (x*2 over {a.hbm_gib:g} GiB): {hbm / 1e9:.0f} GB/s", flush=True)
    sm_scale = D ** -0.5
    rows = []
    print(f"{'batch':>5} {'ctx':>5} {'impl':<18} {'us':>9} {'GB/s':>7} {'%HBM':>6} {'rel_err':>9}", flush=True)
    for ctx in a.context:
        for batch in a.batch:
            cfg = dict(batch=batch, context=ctx)
            kv_bytes = batch * (ctx + 1) * KVH * D * 2 * jnp.dtype(DTYPE).itemsize  # K + V owned by the sequences
            if kv_bytes > KV_BYTES_LIMIT:
                print(f"{batch:>5} {ctx:>5} skipped: {kv_bytes / 1e9:.1f} GB of KV", flush=True)
                continue
            if time.perf_counter() - t_start > a.budget_s:
                print(f"{batch:>5} {ctx:>5} skipped: time budget", flush=True)
                rows.append({**cfg, "skipped": "time budget"})
                continue
            q, kp, vp, hbs = build(batch, ctx)
            n_tok = hbs["static"][0].num_tokens
            splits = max(1, min(16, math.ceil(2 * num_sms() / (batch * KVH)), math.ceil((ctx + 1) / (4 * PS))))
            impls = {}
            for loop, (hb, chunk) in hbs.items():
                impls[f"ref_{loop}"] = (hb, lambda x, k, v, *m, chunk=chunk, st=loop == "static":
                                        ragged_paged_attention_reference(x, k, v, *m, sm_scale=sm_scale,
                                                                         kv_chunk_pages=chunk, static_loop=st))
            for ppb, ks in [(1, 1), (4, 1), (8, 1)] + ([(4, splits)] if splits > 1 else []):
                impls[f"kernel_p{ppb}_s{ks}"] = (hbs["static"][0], lambda x, k, v, *m, ppb=ppb, ks=ks:
                                                 ragged_paged_attention(x, k, v, *m, sm_scale=sm_scale,
                                                                        pages_per_block=ppb, kv_splits=ks,
                                                                        interpret=a.interpret))
            cfg_rows, ref_out = [], None
            for name, (hb, fn) in impls.items():
                row = {**cfg, "impl": name, "bucket": str(hb.bucket), "kv_bytes": int(kv_bytes)}
                try:
                    us, first = time_us(looped(fn, a.inner), (q, kp, vp, *meta(hb)), a.inner, a.reps)
                    row.update(us=us, gbps=kv_bytes / (us * 1e-6) / 1e9, pct_hbm=100 * kv_bytes / (us * 1e-6) / hbm)
                    if name == "ref_while":
                        ref_out = first
                    row["_out"] = first
                except Exception as e:  # keep going: one failing variant must not lose the run
                    row["error"] = f"{type(e).__name__}: {str(e)[:800]}"
                cfg_rows.append(row)
            for r in cfg_rows:
                if "error" in r:
                    print(f"{batch:>5} {ctx:>5} {r['impl']:<18} ERROR {r['error'][:300]}", flush=True)
                    continue
                out = r.pop("_out")
                if ref_out is not None:
                    r["rel_err_vs_ref_while"] = rel_norm(out, ref_out, n_tok)
                print(f"{batch:>5} {ctx:>5} {r['impl']:<18} {r['us']:>9.1f} {r['gbps']:>7.0f} {r['pct_hbm']:>5.1f}% "
                      f"{r.get('rel_err_vs_ref_while', float('nan')):>9.2e}", flush=True)
            rows.extend(cfg_rows)
            del q, kp, vp
    path = write_result("kernel-paged-attention", {
        "shape": dict(heads=H, kv_heads=KVH, head_dim=D, page_size=PS, dtype=jnp.dtype(DTYPE).name),
        "hbm_ceiling_gbps": hbm / 1e9, "inner": a.inner, "reps": a.reps, "num_sms": num_sms(),
        "interpret": a.interpret, "wall_s": time.perf_counter() - t_start, "rows": rows})
    print(f"wrote {path} in {time.perf_counter() - t_start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
