"""Where the time of a decode-attention layer call goes (H200 probe for the split-K / small-batch work).

For a few decode configs (one query token per sequence, metadata from the engine's bucket ladder exactly as in
benchmarks/kernels/paged_attention.py) it times, per layer call:
  full      ragged_paged_attention (tile gather + pallas_call + split merge + tile -> token scatter)
  kernel    the pallas_call alone on pre-tiled queries (attention_call): full - kernel = the jnp around it
  nt=N      full with the tile arrays cut to their first N tiles (a bucket with fewer empty tiles)
  merge=kernel  full with idle splits storing nothing and the Pallas merge reading only busy partials
  engine    full with the engine's choice (models/attention.py: decode_kv_splits, kernel_num_stages)
  peer      JAX's bundled Triton paged_attention (its defaults)
each as `inner` dependent calls unrolled in one jitted function ("unrolled": like the 32 layers of a model step)
and, for a few, as a lax.scan of them ("scan": the kernel benchmark's loop; the difference is the loop's cost).
Plus (splits, num_warps, num_stages) variants where one split already gives more programs than 2 x the SMs.
Prints one line per variant and writes benchmarks/results/decode-attention-cost-<date>.json after every config.

  python benchmarks/probes/decode_attention_cost.py            # H200, ~2 min
  python benchmarks/probes/decode_attention_cost.py --interpret --configs 1x64 --inner 2 --reps 1   # CPU smoke
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

from benchmarks.common import write_result  # noqa: E402
from benchmarks.kernels import paged_attention as pab  # noqa: E402
from benchmarks.peers import jax_paged_attention as peer  # noqa: E402
from jaxinfer.models.attention import decode_kv_splits, device_num_sms, kernel_num_stages  # noqa: E402
from pallas_kernels.paged_attention import kernel as pk  # noqa: E402


def _time(fn, args, reps: int) -> float:
    compiled = jax.jit(fn).lower(*args).compile()
    jax.block_until_ready(compiled(*args))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def chain(call, inner: int, scan: bool):
    """inner dependent calls of call(x, *rest) -> x'."""
    def run(x, *rest):
        if scan:
            return jax.lax.scan(lambda c, _: (call(c, *rest).astype(c.dtype), None), x, None, length=inner)[0]
        for _ in range(inner):
            x = call(x, *rest).astype(x.dtype)
        return x
    return run


def full_call(ppb, ks, nw, ns, nt, interpret, merge="xla"):
    def call(q, kp, vp, pos, tt, ts, tkl, pt):
        if nt is not None:
            tt, ts, tkl = tt[:nt], ts[:nt], tkl[:nt]
        return pk.ragged_paged_attention(q, kp, vp, pos, tt, ts, tkl, pt, sm_scale=pab.D ** -0.5,
                                         pages_per_block=ppb, kv_splits=ks, merge=merge, num_warps=nw,
                                         num_stages=ns, interpret=interpret)
    return call


def kernel_call(ppb, ks, nw, ns, interpret):
    def call(qt, qpos_rows, kp, vp, ts, tkl, lo, pt):
        out = pk.attention_call(qt, qpos_rows, kp, vp, ts, tkl, lo, pt, sm_scale=pab.D ** -0.5,
                                sliding_window=None, soft_cap=None, pages_per_block=ppb, kv_splits=ks, num_warps=nw,
                                num_stages=ns, interpret=interpret)
        return out if ks == 1 else out[0][0]
    return call


def run_config(batch, ctx, a, rows):
    hbs, page_lists, num_pages = pab.host_batches(batch, ctx)
    hb = hbs["static"][0]
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    kp, vp = pab.random_pool(k1, num_pages), pab.random_pool(k2, num_pages)
    q = jax.random.normal(k3, (hb.bucket.num_tokens, pab.H, pab.D), pab.DTYPE)
    md = pab.meta(hb)
    pos, tt, ts, tkl, pt = md
    nbytes = pab.kv_bytes(batch, ctx)
    n_active = int(np.sum(np.asarray(tkl) > 0))

    def record(name, seconds, inner, **params):
        us = seconds / inner * 1e6
        row = dict(batch=batch, context=ctx, name=name, us=us, tbps=nbytes / (us * 1e-6) / 1e12, inner=inner,
                   bucket=str(hb.bucket), **params)
        rows.append(row)
        print(f"{batch:>4} x {ctx:>6} {name:<34} {us:>9.1f} us {row['tbps']:>5.2f} TB/s", flush=True)

    def full(name, ppb=4, ks=1, nw=4, ns=2, nt=None, scan=False, merge="xla"):
        try:
            fn = chain(full_call(ppb, ks, nw, ns, nt, a.interpret, merge), a.inner, scan)
            record(name, _time(lambda x: fn(x, kp, vp, *md), (q,), a.reps), a.inner, ppb=ppb, ks=ks,
                   nw=nw, ns=ns, nt=nt, scan=scan, merge=merge)
        except Exception as e:  # keep going
            print(f"{name}: {type(e).__name__}: {str(e)[:300]}", flush=True)

    def kernel_only(name, ppb=4, ks=1, nw=4, ns=2, nt=None):
        tt_, ts_, tkl_ = (tt, ts, tkl) if nt is None else (tt[:nt], ts[:nt], tkl[:nt])
        qt, qpos_rows = pk.tile_queries(q, pos, tt_, pab.KVH)
        lo = pk.first_blocks(qpos_rows, tkl_, None, ppb * pab.PS)
        fn = chain(kernel_call(ppb, ks, nw, ns, a.interpret), a.inner, False)
        try:
            record(name, _time(lambda x: fn(x, qpos_rows, kp, vp, ts_, tkl_, lo, pt), (qt,), a.reps), a.inner,
                   ppb=ppb, ks=ks, nt=nt)
        except Exception as e:
            print(f"{name}: {type(e).__name__}: {str(e)[:300]}", flush=True)

    nt_small = n_active + 1
    splits = decode_kv_splits(hb.bucket.num_seqs, pab.KVH, a.sms)
    full(f"engine p4 s{splits} ns{kernel_num_stages(splits)}", 4, splits, ns=kernel_num_stages(splits))
    full("full p4 s1 ns2", 4, 1, ns=2)
    full("full p4 s1 ns2 scan", 4, 1, ns=2, scan=True)
    if batch * pab.KVH <= 2 * a.sms:  # few programs: the split-K questions
        kernel_only(f"kernel p4 s{splits} ns1", 4, splits, ns=1)
        full(f"full p4 s{splits} ns1 merge=kernel", 4, splits, ns=1, merge="kernel")
        full("full p4 s16 ns1 merge=kernel", 4, 16, ns=1, merge="kernel")
        full(f"full p4 s{splits} ns1 nt={nt_small}", 4, splits, ns=1, nt=nt_small)
        kernel_only(f"kernel p4 s{splits} ns1 nt={nt_small}", 4, splits, ns=1, nt=nt_small)
        for ppb, ks in ((4, 16), (8, 16), (8, 8), (4, 4)):
            if (ppb, ks) != (4, splits):
                full(f"full p{ppb} s{ks} ns1", ppb, ks, ns=1)
        full(f"full p4 s{splits} ns1 nw2", 4, splits, ns=1, nw=2)
    else:  # many programs: tuning without / with a few splits
        for ks, nw, ns in ((1, 4, 1), (1, 4, 3), (1, 8, 2), (2, 4, 1), (2, 4, 2), (4, 4, 1), (16, 4, 1)):
            full(f"full p4 s{ks} nw{nw} ns{ns}", 4, ks, nw=nw, ns=ns)
        full("full p8 s1 ns3", 8, 1, ns=3)
        kernel_only("kernel p4 s1", 4, 1)
    peer_fn = peer.load()
    if not isinstance(peer_fn, str) and not a.interpret:
        kt, vt = peer.to_peer_layout(kp), peer.to_peer_layout(vp)
        lengths = jnp.full((batch,), ctx + 1, jnp.int32)
        params = dict(peer.DEFAULTS)
        bt = jnp.asarray(peer.block_tables(page_lists, params["k_splits"], params["pages_per_compute_block"]))
        call = peer.make_call(peer_fn, params, pab.D ** -0.5, False)
        for scan in (False, True):
            fn = chain(lambda x, *r: call(x, *r), a.inner, scan)
            try:
                record("peer" + (" scan" if scan else ""), _time(lambda x: fn(x, kt, vt, bt, lengths),
                                                               (q[:batch],), a.reps), a.inner, scan=scan)
            except Exception as e:
                print(f"peer: {type(e).__name__}: {str(e)[:300]}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", default=["1x512", "1x4096", "1x32768", "16x4096", "64x4096", "32x4096"])
    ap.add_argument("--inner", type=int, default=32, help="dependent calls per timed run (32 = one model step)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--interpret", action="store_true")
    a = ap.parse_args(argv)
    a.sms = device_num_sms()
    rows = []
    for c in a.configs:  # the JSON is rewritten after every config: a time limit loses at most the config in flight
        b, ctx = (int(x) for x in c.split("x"))
        run_config(b, ctx, a, rows)
        path = write_result("decode-attention-cost", dict(inner=a.inner, reps=a.reps, sms=a.sms, rows=rows))
    print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
