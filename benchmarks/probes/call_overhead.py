"""How much host time does one call of a compiled XLA program cost, by number of argument buffers? (issue 17)

The 8B step's call costs ~2 ms of host time on the H200 with command buffers on (host_step_cost.py "dispatch";
step_dispatch.py), and the 1B model's decode is host-bound (latency.py: step 2.91 ms, device-only 1.32 ms). The
step takes ~360 buffers (9 weights x layers, K and V per layer, the batch, the penalty table). This probe times the
call (until it returns, not the device work) of a trivial program over N buffers, N = 1 .. 512, each read once:

  separate    N arrays of [rows, 256] bf16, out = x + sum_i a_i[0]        (the step's layout: one buffer per weight)
  stacked     one [N, rows, 256] array, the same sum                       (the layer-stacked layout)
  donated     separate, plus a donated [N, 256] state updated in place     (the KV cache's donation)

For each: median / p10 call time over --iters back-to-back calls, and per buffer. If the separate call grows
~linearly in N, the per-buffer cost of PjRt's execute path, not kernel launches, is the step's dispatch cost.

  python benchmarks/probes/call_overhead.py [--n 1 16 64 256 512] [--iters 200]
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


def time_calls(fn, args, iters: int) -> tuple[float, float]:
    """(median, p10) seconds of one call returning, back to back; fn(args) -> (new args, output)."""
    for _ in range(5):
        args, out = fn(args)
    jax.block_until_ready(out)
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        args, out = fn(args)
        ts.append(time.perf_counter() - t0)
    jax.block_until_ready(out)
    return float(np.median(ts)), float(np.percentile(ts, 10))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, nargs="+", default=[1, 16, 64, 256, 512])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--iters", type=int, default=200)
    a = ap.parse_args()
    rows = []
    for n in a.n:
        ws = [jnp.full((a.rows, 256), i, jnp.bfloat16) for i in range(n)]
        stacked = jnp.stack(ws)
        x = jnp.zeros((256,), jnp.float32)
        state = jnp.zeros((n, 256), jnp.bfloat16)

        sep = jax.jit(lambda ws, x: x + sum(w[0].astype(jnp.float32) for w in ws)).lower(ws, x).compile()
        stk = jax.jit(lambda s, x: x + s[:, 0].astype(jnp.float32).sum(0)).lower(stacked, x).compile()

        def don_f(ws, st, x):
            st = st + jnp.stack([w[0] for w in ws])
            return st, x + st[0].astype(jnp.float32)

        don = jax.jit(don_f, donate_argnums=1).lower(ws, state, x).compile()
        r = dict(n=n)
        r["separate"] = time_calls(lambda s: (s, sep(ws, s)), x, a.iters)
        r["stacked"] = time_calls(lambda s: (s, stk(stacked, s)), x, a.iters)

        def don_step(st):
            st, out = don(ws, st, x)
            return st, out

        r["donated"] = time_calls(don_step, state, a.iters)
        rows.append(r)
        print(f"n {n:4d}: " + " | ".join(f"{k} {v[0] * 1e6:7.1f} us (p10 {v[1] * 1e6:7.1f}, {v[0] * 1e6 / n:5.2f}/buf)"
                                        for k, v in r.items() if k != "n"), flush=True)
    path = write_result("call-overhead", dict(backend=jax.default_backend(), rows_per_buffer=a.rows,
                                              rows=[{k: (v if k == "n" else dict(median_s=v[0], p10_s=v[1]))
                                                     for k, v in r.items()} for r in rows]))
    print("wrote", path)


if __name__ == "__main__":
    main()
