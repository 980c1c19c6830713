"""Decode attention on the GPU: the Pallas ragged paged-attention kernel vs the jnp (XLA gather) reference vs JAX's
bundled Triton `paged_attention` (the peer), on the same K/V, in one process (issue 4 item 5).

Shape: Llama-3-8B attention, 32 q heads / 8 KV heads / head_dim 128, bf16 KV, page 16; one decode token per
sequence, every sequence with `context` cached tokens on shuffled pages (pools of random bf16). Default grid:
batch {1, 16, 64, 256} x context {512, 2k, 4k, 8k, 32k}; a config whose K + V exceed --kv-limit-gb (40 GB; 256 x
32k is 34.4 GB) is recorded as skipped. Metadata come from `pack` + `BucketLadder` with the engine's defaults.

Variants per config:
  * reference, both loop settings: static_loop=True with kv_chunk_pages 128 (the engine's GPU setting) and the
    while loop with 16 pages per chunk. Both run at every config: with `inner` adapted (below) even 256 x 32k
    costs under a second of calls each. `ref_while`'s first output is the reference of every rel_err.
  * kernel, at most 4 (pages per loop step, split-K) pairs, by this rule (P = ceil((context + 1) / 16) pages):
      first the engine's choice (4, K_engine) (models/attention.py: 64 tokens per step; decode_kv_splits for the
        bucket the batch runs in: 8 splits where sequences x KV heads fit one wave of SMs, else none);
      always (4, 1) (no split);
      batch * KVH < 2 * SMs (too few programs to fill the GPU: batch 1 and 16 on 132 SMs): split-K with
        K = min(16, ceil(2 * SMs / (batch * KVH)), ceil(P / 4)) at 4 and at 8 pages per step;
      otherwise (8, 1), and (4, 2) while batch * KVH < 8 * SMs (a few waves, where a partial last wave costs).
    (From the H200 run of 2026-11-30: 1 page per step never won; 4 won most configs, 8 some long contexts;
    split-K won at batch 1 and 16 except 1 x 512.) Split variants run without software pipelining, as in the
    engine (kernel_num_stages).
  * peer, JAX's bundled kernel (benchmarks/peers/jax_paged_attention.py) with its own defaults (8 pages per compute
    block, 16 splits), plus 8 pages with the split rule's K where that is not 16. Its pools are our pools
    transposed to its [KVH, num_pages, page_size, D] layout once per config, outside the timing, after our pools
    are freed (peak memory 1.5x the KV). Its output is checked against the reference like ours.
Timing: median of --reps runs of a jitted scan of `inner` dependent calls (each call's output is the next call's
q: nothing is hoisted, dispatch is amortised), divided by `inner`; inner = clamp(ceil(4 ms / estimated call),
1, --inner), the estimate from the KV bytes at 0.4 TB/s (reference) or 2 TB/s (kernels). Compilation (AOT, timed
as compile_s) and --warmup runs come first. GB/s = K + V bytes owned by the sequences (batch x (context + 1)
tokens) / time; % HBM = that over the ceiling measured first (XLA x * 2 over 2 GiB). Pools above 4 GiB make the
Triton lowering use 64-bit offsets (jax's rule): recorded per config as `int64_offsets`.
Order: configs inside the target region (batch >= 64 and context >= 4k) first, then the rest, each by KV size;
past --budget-s the remaining configs are recorded as skipped. The JSON
(benchmarks/results/kernel-paged-attention-<date>.json, or --out) is rewritten after every config.

Output: a line per variant as it is measured (us, TB/s, % HBM, rel_err, inner, compile s) and a summary line per
config; at the end one table line per config (best reference; best kernel variant: us, TB/s, % HBM, x vs the
reference; the engine's choice and its x vs the reference; best peer variant and the kernel's x vs it; rel_err of
the kernel and the peer), then the targets: >= 3.2 TB/s at batch >= 64 x context >= 4k, and the kernel never
slower than the reference, for the best variant and for the engine's choice. The JSON has every row and config.

Wall time of the default grid on the H200, estimated by --dry-run from the 2026-11-30 run (there each variant cost
0.6 s beyond its calls: compile, transfers): 20 configs, 131 variants, ~4 s of calls (inner adapts), ~1 s per config
for the pools and the peer's layout -> ~105 s at 0.6 s per variant, ~420 s at 3 s (+ ~15 s start-up). --budget-s
380 keeps the call under ~7 minutes either way (at 3 s per variant the last few small configs would be skipped).

  python benchmarks/kernels/paged_attention.py                      # the default grid (H200)
  python benchmarks/kernels/paged_attention.py --dry-run            # the plan and its time estimate, no device
  python benchmarks/kernels/paged_attention.py --lower-only         # lower every Pallas variant for CUDA (on CPU)
  python benchmarks/kernels/paged_attention.py --interpret --batch 1 4 --context 64 128 --inner 1 --reps 1 \
      --warmup 0 --hbm-gib 0.01                                     # CPU smoke run (~30 s)
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.common import RESULTS_DIR, measure_hbm_bandwidth, write_result  # noqa: E402
from benchmarks.peers import jax_paged_attention as peer  # noqa: E402
from jaxinfer.models.attention import decode_kv_splits, device_num_sms, kernel_num_stages  # noqa: E402
from jaxinfer.outputs import SeqInput  # noqa: E402
from jaxinfer.runner.batch import pack  # noqa: E402
from jaxinfer.runner.buckets import BucketLadder  # noqa: E402
from pallas_kernels.paged_attention.kernel import ragged_paged_attention  # noqa: E402
from pallas_kernels.paged_attention.reference import ragged_paged_attention_reference  # noqa: E402

H, KVH, D, PS = 32, 8, 128, 16
DTYPE = jnp.bfloat16
MAX_NUM_SEQS, MAX_BATCHED = 256, 2048  # the engine's defaults (config.py): decide the decode bucket
TARGET_TBPS = 3.2                       # issue 4: at batch >= 64 x context >= 4k
ASSUMED_BPS = {"ref": 0.4e12, "kernel": 2e12, "peer": 2e12}  # only to choose `inner` (and for --dry-run)
RUN_S = 4e-3                            # aim: each timed run lasts >= 4 ms, so dispatch is a small fraction
PREVIOUS = os.path.join(RESULTS_DIR, "kernel-paged-attention-2026-11-30.json")  # --dry-run's per-call model


# --------------------------------------------------------------------------------------------------------------
# The plan: configs, their order, their variants
# --------------------------------------------------------------------------------------------------------------
def kv_bytes(batch: int, ctx: int) -> int:
    """K + V bytes owned by the sequences: batch x (context + 1) tokens x KVH x D, bf16."""
    return batch * (ctx + 1) * KVH * D * 2 * jnp.dtype(DTYPE).itemsize


def in_target(batch: int, ctx: int) -> bool:
    return batch >= 64 and ctx >= 4096


def plan(batches, contexts, kv_limit_gb: float) -> list[dict]:
    """Configs in run order (module docstring); too large ones carry `skipped`."""
    cfgs = []
    for b in batches:
        for c in contexts:
            cfg = dict(batch=b, context=c, kv_bytes=kv_bytes(b, c))
            if cfg["kv_bytes"] > kv_limit_gb * 1e9:
                cfg["skipped"] = (f"{cfg['kv_bytes'] / 1e9:.1f} GB of K + V exceeds --kv-limit-gb {kv_limit_gb:g} "
                                  f"(the run peaks at 1.5x the KV while converting to the peer's layout)")
            cfgs.append(cfg)
    return sorted(cfgs, key=lambda c: (not in_target(c["batch"], c["context"]), c["kv_bytes"]))


def split_rule(batch: int, ctx: int, sms: int) -> int:
    """K of split-K: enough programs for ~2 per SM, at most 16, at least 4 pages per split."""
    return max(1, min(16, math.ceil(2 * sms / (batch * KVH)), math.ceil(math.ceil((ctx + 1) / PS) / 4)))


def engine_splits(batch: int, sms: int) -> int:
    """kv_splits the engine uses for a decode batch: decode_kv_splits of the bucket it runs in (engine defaults)."""
    ladder = BucketLadder.build(max_num_batched_tokens=MAX_BATCHED, max_num_seqs=MAX_NUM_SEQS, max_model_len=PS,
                                page_size=PS, query_tile=16, kv_chunk_pages=1)
    return decode_kv_splits(ladder.pick(batch, batch).num_seqs, KVH, sms)


def kernel_variants(batch: int, ctx: int, sms: int) -> list[tuple[int, int]]:
    """(pages_per_block, kv_splits) pairs, by the rule of the module docstring; the engine's choice first."""
    out = [(4, engine_splits(batch, sms))]
    if (4, 1) not in out:
        out.append((4, 1))
    if batch * KVH < 2 * sms:
        k = split_rule(batch, ctx, sms)
        more = [(4, k), (8, k)] if k > 1 else [(8, 1)]
    else:
        more = [(8, 1)] + ([(4, 2)] if batch * KVH < 8 * sms else [])
    return out + [v for v in more if v not in out]


def inner_for(kind: str, nbytes: int, max_inner: int) -> int:
    est = nbytes / ASSUMED_BPS[kind]
    return int(max(1, min(max_inner, math.ceil(RUN_S / max(est, 1e-9)))))


# --------------------------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------------------------
def host_batches(batch: int, ctx: int, seed: int = 0):
    """Packed decode metadata for the two reference settings (their table widths differ; the kernel uses the
    static one's) and the page lists [batch, pages_per_seq] (for the peer). Pages are shuffled; page 0 is the
    engine's reserved page."""
    rng = np.random.default_rng(seed)
    pages_per_seq = math.ceil((ctx + 1) / PS)
    num_pages = batch * pages_per_seq + 1
    page_lists = rng.permutation(np.arange(1, num_pages)).astype(np.int32).reshape(batch, pages_per_seq)
    seqs = [SeqInput(token_ids=[1], start_pos=ctx, page_table=page_lists[i].tolist()) for i in range(batch)]
    mml = ctx + PS
    hbs = {}
    for loop, chunk in (("while", 16), ("static", 128)):
        chunk = min(chunk, math.ceil(mml / PS))
        ladder = BucketLadder.build(max_num_batched_tokens=MAX_BATCHED, max_num_seqs=MAX_NUM_SEQS, max_model_len=mml,
                                    page_size=PS, query_tile=16, kv_chunk_pages=chunk)
        hbs[loop] = (pack(seqs, ladder.pick(batch, batch), PS), chunk)
    return hbs, page_lists, num_pages


@functools.partial(jax.jit, static_argnames=("chunk",), donate_argnums=0)
def _fill_chunk(buf, key, start, *, chunk: int):
    part = jax.random.normal(key, (chunk,) + buf.shape[1:], buf.dtype)  # [chunk, PS, KVH, D]
    return jax.lax.dynamic_update_slice(buf, part, (start, 0, 0, 0))


def random_pool(key, num_pages: int, chunk_pages: int = 16384):
    """Random normal bf16 [num_pages, PS, KVH, D], generated chunk by chunk into a donated buffer (bounds the RNG's
    temporaries whatever the pool size; the last chunk is clamped into place, overlapping the one before)."""
    chunk = min(chunk_pages, num_pages)
    buf = jnp.zeros((num_pages, PS, KVH, D), DTYPE)
    for i, start in enumerate(range(0, num_pages, chunk)):
        buf = _fill_chunk(buf, jax.random.fold_in(key, i), jnp.int32(start), chunk=chunk)
    return buf


def meta(hb):
    a = hb.arrays
    return tuple(jnp.asarray(a[n]) for n in ("positions", "tile_tokens", "tile_seq", "tile_kv_len", "page_tables"))


# --------------------------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------------------------
def looped(fn, inner):
    """`inner` dependent calls (each call's q is the previous call's output). Returns (last, first output); the
    first is the one checked against the reference."""
    def run(q, kp, vp, *md):
        first = fn(q, kp, vp, *md).astype(q.dtype)

        def body(x, _):
            return fn(x, kp, vp, *md).astype(x.dtype), None
        x, _ = jax.lax.scan(body, first, None, length=inner - 1)
        return x, first
    return run


def measure(fn, args, inner: int, reps: int, warmup: int):
    """-> ({us, us_min, compile_s, inner, reps}, first output)."""
    t0 = time.perf_counter()
    compiled = jax.jit(looped(fn, inner)).lower(*args).compile()
    compile_s = time.perf_counter() - t0
    for _ in range(warmup):
        jax.block_until_ready(compiled(*args))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = compiled(*args)
        jax.block_until_ready(out)
        ts.append(time.perf_counter() - t0)
    return dict(us=float(np.median(ts)) / inner * 1e6, us_min=min(ts) / inner * 1e6, compile_s=compile_s,
                inner=inner, reps=reps), out[1]


def rel_norm(x, y, n: int) -> float:
    x = np.asarray(x[:n], np.float32)
    y = np.asarray(y[:n], np.float32)
    return float(np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-30))


# --------------------------------------------------------------------------------------------------------------
# One config
# --------------------------------------------------------------------------------------------------------------
def _ref_fn(chunk: int, static: bool, sm_scale: float):
    return lambda x, k, v, *m: ragged_paged_attention_reference(x, k, v, *m, sm_scale=sm_scale, kv_chunk_pages=chunk,
                                                                static_loop=static)


def _kernel_fn(ppb: int, ks: int, sm_scale: float, interpret: bool):
    return lambda x, k, v, *m: ragged_paged_attention(x, k, v, *m, sm_scale=sm_scale, pages_per_block=ppb,
                                                      kv_splits=ks, num_stages=kernel_num_stages(ks),
                                                      interpret=interpret)


def run_config(cfg: dict, a, hbm: float, sms: int, peer_fn) -> list[dict]:
    batch, ctx, nbytes = cfg["batch"], cfg["context"], cfg["kv_bytes"]
    sm_scale = D ** -0.5
    hbs, page_lists, num_pages = host_batches(batch, ctx)
    cfg["int64_offsets"] = num_pages * PS * KVH * D * jnp.dtype(DTYPE).itemsize > 2**32
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    kp, vp = random_pool(k1, num_pages), random_pool(k2, num_pages)
    q = jax.random.normal(k3, (hbs["static"][0].bucket.num_tokens, H, D), DTYPE)  # [T, H, D]; rows >= batch: padding
    rows, ref_out = [], None

    def timed(name, kind, fn, args, params, hb=None):
        nonlocal ref_out
        row = dict(batch=batch, context=ctx, impl=name, kind=kind, params=params, kv_bytes=nbytes)
        if hb is not None:
            row["bucket"] = str(hb.bucket)
        try:
            m, first = measure(fn, args, inner_for(kind, nbytes, a.inner), a.reps, a.warmup)
            row.update(m, gbps=nbytes / (m["us"] * 1e-6) / 1e9, pct_hbm=100 * nbytes / (m["us"] * 1e-6) / hbm)
            if ref_out is None and kind == "ref":
                ref_out, cfg["checked_against"] = first, name
            if ref_out is not None:
                row["rel_err"] = rel_norm(first, ref_out, batch)
        except Exception as e:  # keep going: one failing variant must not lose the run
            row["error"] = f"{type(e).__name__}: {str(e)[:800]}"
        print_row(row)
        rows.append(row)

    for loop in ("while", "static"):  # while first: its output is the reference of every rel_err
        hb, chunk = hbs[loop]
        timed(f"ref_{loop}", "ref", _ref_fn(chunk, loop == "static", sm_scale), (q, kp, vp, *meta(hb)),
              dict(kv_chunk_pages=chunk, static_loop=loop == "static"), hb)
    hb = hbs["static"][0]
    md = meta(hb)
    cfg["engine_variant"] = f"kernel_p4_s{engine_splits(batch, sms)}"
    for ppb, ks in kernel_variants(batch, ctx, sms):
        timed(f"kernel_p{ppb}_s{ks}", "kernel", _kernel_fn(ppb, ks, sm_scale, a.interpret), (q, kp, vp, *md),
              dict(pages_per_block=ppb, kv_splits=ks), hb)
    del md

    if isinstance(peer_fn, str):
        cfg["peer"] = peer_fn
    elif a.no_peer:
        cfg["peer"] = "not run (--no-peer)"
    else:  # its layout, converted once, our pools freed first
        kt = peer.to_peer_layout(kp)
        kp.delete()
        vt = peer.to_peer_layout(vp)
        vp.delete()
        lengths = jnp.full((batch,), ctx + 1, jnp.int32)
        for params in peer.variants(split_rule(batch, ctx, sms)):
            bt = jnp.asarray(peer.block_tables(page_lists, params["k_splits"], params["pages_per_compute_block"]))
            timed(peer.name(params), "peer", peer.make_call(peer_fn, params, sm_scale, a.interpret),
                  (q[:batch], kt, vt, bt, lengths), params)
        kt.delete()
        vt.delete()
    return rows


def print_row(r: dict) -> None:
    head = f"{r['batch']:>5} {r['context']:>6} {r['impl']:<16}"
    if "error" in r:
        print(f"{head} ERROR {r['error'][:300]}", flush=True)
        return
    print(f"{head} {r['us']:>10.1f} {r['gbps'] / 1e3:>6.2f} {r['pct_hbm']:>5.1f}% "
          f"{r.get('rel_err', float('nan')):>9.2e}  (inner {r['inner']}, compile {r['compile_s']:.1f} s)", flush=True)


# --------------------------------------------------------------------------------------------------------------
# Summaries
# --------------------------------------------------------------------------------------------------------------
def _best(rows, kind, impl=None):
    ok = [r for r in rows if r["kind"] == kind and "us" in r and (impl is None or r["impl"] == impl)]
    return min(ok, key=lambda r: r["us"]) if ok else None


def summarize(cfg: dict, rows: list[dict]) -> None:
    """Adds to cfg the best kernel / reference / peer variant, the engine's choice and the ratios, and to every
    row its speed-up vs the best reference and the best peer variant; prints one line."""
    k, ref, p = _best(rows, "kernel"), _best(rows, "ref"), _best(rows, "peer")
    eng = _best(rows, "kernel", cfg.get("engine_variant"))
    for r in rows:
        if "us" in r:
            if ref:
                r["speedup_vs_ref"] = ref["us"] / r["us"]
            if p:
                r["speedup_vs_peer"] = p["us"] / r["us"]
    s = cfg
    for tag, r in (("kernel", k), ("ref", ref), ("peer", p), ("engine", eng)):
        if r:
            s[f"{tag}_impl"], s[f"{tag}_us"], s[f"{tag}_tbps"] = r["impl"], r["us"], r["gbps"] / 1e3
            s[f"{tag}_pct_hbm"], s[f"{tag}_rel_err"] = r["pct_hbm"], r.get("rel_err")
    if k and ref:
        s["kernel_speedup_vs_ref"] = ref["us"] / k["us"]
    if eng and ref:
        s["engine_speedup_vs_ref"] = ref["us"] / eng["us"]
    if k and p:
        s["kernel_speedup_vs_peer"] = p["us"] / k["us"]
    line = f"{cfg['batch']:>5} {cfg['context']:>6} SUMMARY "
    if k:
        line += (f"kernel {k['impl']} {k['us']:.1f} us = {k['gbps'] / 1e3:.2f} TB/s ({k['pct_hbm']:.0f}% HBM)"
                 f", rel_err {k.get('rel_err', float('nan')):.1e}")
    if ref:
        line += f"; ref {ref['impl']} {ref['us']:.1f} us ({s.get('kernel_speedup_vs_ref', float('nan')):.2f}x)"
    if p:
        line += (f"; peer {p['impl']} {p['us']:.1f} us ({s.get('kernel_speedup_vs_peer', float('nan')):.2f}x), "
                 f"rel_err {p.get('rel_err', float('nan')):.1e}")
    print(line, flush=True)


def print_table(cfgs: list[dict]) -> None:
    """One line per measured config (the end of the log: what a cut-off output tail still shows)."""
    nan = float("nan")
    print(f"{'batch':>5} {'ctx':>6} {'KV GB':>6} | {'ref us':>9} {'(best ref)':<10} | {'kernel us':>9} {'TB/s':>5} "
          f"{'%HBM':>4} {'x ref':>6} {'(best)':<13} | {'engine us':>9} {'x ref':>6} | {'peer us':>9} {'(best)':<12} "
          f"{'x peer':>6} | {'err kern':>8} {'err peer':>8}", flush=True)
    for c in cfgs:
        head = f"{c['batch']:>5} {c['context']:>6} {c['kv_bytes'] / 1e9:>6.2f}"
        if "skipped" in c:
            print(f"{head} skipped: {c['skipped']}", flush=True)
            continue
        if "kernel_us" not in c and "ref_us" not in c:
            print(f"{head} no result (every variant failed: see the rows)", flush=True)
            continue

        def g(k):
            v = c.get(k)
            return nan if v is None else v
        print(f"{head} | {g('ref_us'):>9.1f} {c.get('ref_impl', '-'):<10} | {g('kernel_us'):>9.1f} "
              f"{g('kernel_tbps'):>5.2f} {g('kernel_pct_hbm'):>4.0f} {g('kernel_speedup_vs_ref'):>6.2f} "
              f"{c.get('kernel_impl', '-'):<13} | {g('engine_us'):>9.1f} {g('engine_speedup_vs_ref'):>6.2f} | "
              f"{g('peer_us'):>9.1f} {c.get('peer_impl', '-'):<12} {g('kernel_speedup_vs_peer'):>6.2f} | "
              f"{g('kernel_rel_err'):>8.1e} {g('peer_rel_err'):>8.1e}", flush=True)


def targets(cfgs: list[dict]) -> dict:
    """The issue's two targets, for the best kernel variant and for the engine's choice."""
    done = [c for c in cfgs if "kernel_us" in c]
    out = {}
    for tag in ("kernel", "engine"):
        tgt = [c for c in done if in_target(c["batch"], c["context"]) and f"{tag}_tbps" in c]
        if tgt:
            worst = min(tgt, key=lambda c: c[f"{tag}_tbps"])
            out[f"{tag}_min_tbps_in_target"] = dict(tbps=worst[f"{tag}_tbps"], batch=worst["batch"],
                                                    context=worst["context"], n_configs=len(tgt),
                                                    met=worst[f"{tag}_tbps"] >= TARGET_TBPS)
        vs = [c for c in done if f"{tag}_speedup_vs_ref" in c]
        if vs:
            worst = min(vs, key=lambda c: c[f"{tag}_speedup_vs_ref"])
            out[f"{tag}_min_speedup_vs_ref"] = dict(x=worst[f"{tag}_speedup_vs_ref"], batch=worst["batch"],
                                                    context=worst["context"], n_configs=len(vs),
                                                    met=worst[f"{tag}_speedup_vs_ref"] >= 1.0)
    return out


def print_targets(t: dict) -> None:
    if "kernel_min_tbps_in_target" not in t:
        print(f"TARGET >= {TARGET_TBPS} TB/s at batch >= 64 x context >= 4k: no config of that region measured",
              flush=True)
    for tag, what in (("kernel", "best variant"), ("engine", "engine's choice")):
        m = t.get(f"{tag}_min_tbps_in_target")
        if m:
            print(f"TARGET >= {TARGET_TBPS} TB/s at batch >= 64 x context >= 4k ({what}): min {m['tbps']:.2f} TB/s "
                  f"at {m['batch']} x {m['context']} over {m['n_configs']} configs: {'met' if m['met'] else 'MISSED'}",
                  flush=True)
        m = t.get(f"{tag}_min_speedup_vs_ref")
        if m:
            print(f"TARGET never slower than the reference ({what}): min {m['x']:.2f}x at {m['batch']} x "
                  f"{m['context']} over {m['n_configs']} configs: {'met' if m['met'] else 'MISSED'}", flush=True)


def save(a, hbm: float, sms: int, cfgs: list[dict], rows: list[dict], t_start: float) -> str:
    payload = dict(
        shape=dict(heads=H, kv_heads=KVH, head_dim=D, page_size=PS, dtype=jnp.dtype(DTYPE).name),
        hbm_ceiling_gbps=hbm / 1e9, num_sms=sms, max_inner=a.inner, reps=a.reps, warmup=a.warmup,
        interpret=a.interpret, budget_s=a.budget_s, kv_limit_gb=a.kv_limit_gb,
        wall_s=time.perf_counter() - t_start, targets=targets(cfgs), configs=cfgs, rows=rows)
    if a.out:
        from benchmarks.common import device_name, git_commit
        payload = dict(benchmark="kernel-paged-attention", device=device_name(), jax=jax.__version__,
                       commit=git_commit(), **payload)
        with open(a.out, "w") as f:
            json.dump(payload, f, indent=2)
        return a.out
    return write_result("kernel-paged-attention", payload)


# --------------------------------------------------------------------------------------------------------------
# No-device modes
# --------------------------------------------------------------------------------------------------------------
def _fit_previous(path: str) -> dict:
    """Per-call model us = a + bytes / bw per implementation kind, least squares over the rows of an earlier run
    (without that file: 50 us + the bandwidths assumed for `inner`)."""
    if not os.path.exists(path):
        print(f"no {path}: per-call model = 50 us + KV bytes at {ASSUMED_BPS}")
        return {k: (50e-6, 1 / bw) for k, bw in ASSUMED_BPS.items()}
    with open(path) as f:
        rows = [r for r in json.load(f)["rows"] if "us" in r]
    groups = {"ref": [r for r in rows if r["impl"].startswith("ref")],
              "kernel": [r for r in rows if r["impl"].startswith("kernel")]}
    fit = {}
    for kind, rs in groups.items():
        A = np.array([[1.0, r["kv_bytes"]] for r in rs])
        coef, *_ = np.linalg.lstsq(A, np.array([r["us"] * 1e-6 for r in rs]), rcond=None)
        fit[kind] = (max(coef[0], 0.0), max(coef[1], 1 / 4.8e12))
    fit["peer"] = (fit["kernel"][0], fit["kernel"][1] * 1.3)  # ANCHORS: 480 vs our 388 us at 64 x 4k
    return fit


def dry_run(a, cfgs: list[dict], sms: int) -> None:
    """Print the plan and estimate its wall time: per variant (warmup + reps) x inner calls by the previous run's
    per-call model, plus --assume-variant-s (compile, transfers) per variant."""
    fit = _fit_previous(a.estimate_from)
    total_calls, n_var = 0.0, 0
    for c in cfgs:
        if "skipped" in c:
            print(f"{c['batch']:>5} x {c['context']:>6}: skipped: {c['skipped']}")
            continue
        kinds = ["ref", "ref"] + ["kernel"] * len(kernel_variants(c["batch"], c["context"], sms)) + \
            ["peer"] * len(peer.variants(split_rule(c["batch"], c["context"], sms)))
        calls = sum((a.warmup + a.reps) * inner_for(k, c["kv_bytes"], a.inner)
                    * (fit[k][0] + c["kv_bytes"] * fit[k][1]) for k in kinds)
        total_calls += calls
        n_var += len(kinds)
        print(f"{c['batch']:>5} x {c['context']:>6}: {c['kv_bytes'] / 1e9:6.2f} GB, kernel "
              f"{kernel_variants(c['batch'], c['context'], sms)}, peer splits "
              f"{[v['k_splits'] for v in peer.variants(split_rule(c['batch'], c['context'], sms))]}, "
              f"calls ~{calls:.2f} s")
    n_cfg = sum("skipped" not in c for c in cfgs)
    for per in (0.6, a.assume_variant_s):  # 0.6 s: the 2026-11-30 run's wall time beyond its calls, per variant
        print(f"estimate: {n_cfg} configs, {n_var} variants: {total_calls:.0f} s of calls + {per:g} s per variant "
              f"+ 1 s per config (pools, layout conversion) = {total_calls + per * n_var + n_cfg:.0f} s "
              f"(+ start-up and the HBM probe, ~15 s)")


def lower_only(a, cfgs: list[dict], sms: int, peer_fn) -> int:
    """Lower every Pallas variant (kernel, peer) of the plan for CUDA without a GPU: catches block-shape, Triton
    and peer-assertion errors before the GPU call. Returns the number of failures."""
    failures = 0
    for c in cfgs:
        if "skipped" in c:
            continue
        batch, ctx = c["batch"], c["context"]
        hbs, page_lists, num_pages = host_batches(batch, ctx)
        hb = hbs["static"][0]
        sd = jax.ShapeDtypeStruct
        pool = sd((num_pages, PS, KVH, D), DTYPE)
        q = sd((hb.bucket.num_tokens, H, D), DTYPE)
        md = [sd(x.shape, x.dtype) for x in meta(hb)]
        jobs = [(f"kernel_p{p}_s{k}", _kernel_fn(p, k, D ** -0.5, False), (q, pool, pool, *md))
                for p, k in kernel_variants(batch, ctx, sms)]
        if not isinstance(peer_fn, str):
            tpool = sd((KVH, num_pages, PS, D), DTYPE)
            for params in peer.variants(split_rule(batch, ctx, sms)):
                bt = peer.block_tables(page_lists, params["k_splits"], params["pages_per_compute_block"])
                jobs.append((peer.name(params), peer.make_call(peer_fn, params, D ** -0.5, False),
                             (sd((batch, H, D), DTYPE), tpool, tpool, sd(bt.shape, jnp.int32),
                              sd((batch,), jnp.int32))))
        for name, fn, args in jobs:
            try:
                text = jax.jit(looped(fn, 2)).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
                ok = "triton" in text.lower()
                msg = "lowered" if ok else "lowered, but no Triton call in the HLO"
            except Exception as e:
                ok, msg = False, f"{type(e).__name__}: {str(e)[:300]}"
            failures += not ok
            print(f"{batch:>5} x {ctx:>6} {name:<16} {msg}", flush=True)
    return failures


# --------------------------------------------------------------------------------------------------------------
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--context", type=int, nargs="+", default=[512, 2048, 4096, 8192, 32768])
    ap.add_argument("--inner", type=int, default=10, help="most dependent calls per timed run (fewer for long calls)")
    ap.add_argument("--reps", type=int, default=5, help="timed runs (median)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed runs after compiling")
    ap.add_argument("--budget-s", type=float, default=380.0, help="skip the remaining configs past this time")
    ap.add_argument("--kv-limit-gb", type=float, default=40.0, help="skip configs with more K + V than this")
    ap.add_argument("--no-peer", action="store_true", help="skip JAX's bundled kernel")
    ap.add_argument("--interpret", action="store_true", help="Pallas kernels in interpret mode (CPU smoke test only)")
    ap.add_argument("--hbm-gib", type=float, default=2.0)
    ap.add_argument("--out", default=None,
                    help="JSON path (default: benchmarks/results/kernel-paged-attention-<date>.json)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and its time estimate; no device work")
    ap.add_argument("--estimate-from", default=PREVIOUS, help="earlier result JSON for --dry-run's per-call model")
    ap.add_argument("--assume-variant-s", type=float, default=3.0, help="--dry-run: compile etc. per variant")
    ap.add_argument("--lower-only", action="store_true", help="lower every Pallas variant for CUDA (works on CPU)")
    from benchmarks.common import add_profile_arg
    add_profile_arg(ap)
    a = ap.parse_args(argv)
    bad = [b for b in a.batch if not 1 <= b <= MAX_NUM_SEQS]
    if bad:
        ap.error(f"--batch {bad}: a decode step holds 1 to {MAX_NUM_SEQS} sequences (the engine's max_num_seqs)")
    if min(a.context) < 1 or a.inner < 1 or a.reps < 1 or a.warmup < 0:
        ap.error(f"--context {a.context} / --inner {a.inner} / --reps {a.reps} must be >= 1 and --warmup "
                 f"{a.warmup} >= 0")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    t_start = time.perf_counter()
    sms = device_num_sms()
    cfgs = plan(a.batch, a.context, a.kv_limit_gb)
    if a.dry_run:
        dry_run(a, cfgs, sms)
        return 0
    peer_fn = peer.load()
    if a.lower_only:
        return int(lower_only(a, cfgs, sms, peer_fn) > 0)
    from benchmarks.common import start_profile
    start_profile(a.profile)
    print(f"jax {jax.__version__} on {jax.devices()[0]} ({sms} SMs); peer: "
          f"{peer_fn if isinstance(peer_fn, str) else 'jax.experimental.pallas.ops.gpu.paged_attention'}", flush=True)
    hbm = measure_hbm_bandwidth(a.hbm_gib)
    print(f"HBM ceiling (x*2 over {a.hbm_gib:g} GiB): {hbm / 1e9:.0f} GB/s", flush=True)
    print(f"{'batch':>5} {'ctx':>6} {'impl':<16} {'us':>10} {'TB/s':>6} {'%HBM':>6} {'rel_err':>9}", flush=True)
    rows = []
    for cfg in cfgs:
        if "skipped" in cfg:
            print(f"{cfg['batch']:>5} {cfg['context']:>6} skipped: {cfg['skipped']}", flush=True)
            continue
        if time.perf_counter() - t_start > a.budget_s:
            cfg["skipped"] = f"time budget (--budget-s {a.budget_s:g})"
            print(f"{cfg['batch']:>5} {cfg['context']:>6} skipped: time budget", flush=True)
            continue
        t0 = time.perf_counter()
        cfg_rows = run_config(cfg, a, hbm, sms, peer_fn)
        cfg["wall_s"] = time.perf_counter() - t0
        rows.extend(cfg_rows)
        summarize(cfg, cfg_rows)
        save(a, hbm, sms, cfgs, rows, t_start)  # after every config: a cut run keeps what it measured
    print_table(cfgs)
    print_targets(targets(cfgs))
    path = save(a, hbm, sms, cfgs, rows, t_start)
    print(f"wrote {path} in {time.perf_counter() - t_start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
