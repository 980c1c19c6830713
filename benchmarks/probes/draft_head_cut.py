"""The cost of a draft's LM head, whole and cut to the first N token ids (weights/head_cut.py, draft_head_vocab).

Loads a model at real shapes with random weights (default the Llama-3.2-1B shape, int8 with the tied int8 head: the
1B draft of issue 21), then times, per call of M rows (default 1): the final norm + head + argmax, as the draft's
greedy step runs them (models/llama.py `logits`: the cut head's other ids are -inf), with the whole head and with
heads cut to each N of --vocab. Each figure is the median of --reps timed runs of a jitted loop of --inner dependent
calls (the next call's hidden state depends on the argmax), divided by --inner; beside it the head's weight bytes
at the HBM rate measured in the same process (the roofline) and a bf16 XLA head of the whole vocabulary (the
peer). What a draft step saves is the difference between the whole head's row and a cut one's.

  python benchmarks/probes/draft_head_cut.py [--model llama3.2-1b] [--quantization int8] [--vocab 32768 65536]
  CPU smoke: python benchmarks/probes/draft_head_cut.py --model tiny-llama --vocab 256 --inner 2 --reps 2
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from benchmarks.common import measure_hbm_bandwidth, write_result  # noqa: E402
from jaxinfer.config.quantization import parse_quantization  # noqa: E402
from jaxinfer.weights.head_cut import prune_head  # noqa: E402
from jaxinfer.weights.loader import load_model, resolve_model  # noqa: E402


def head_bytes(loaded) -> int:
    """Bytes of the head's own leaves (a tied float head: the embedding it reads)."""
    module = loaded.module()
    head = module.lm_head
    if head is None:
        return int(module.embed[...].nbytes)
    return sum(int(x.nbytes) for x in jax.tree.leaves(nnx.state(head)))


def time_head(loaded, rows: int, inner: int, reps: int) -> float:
    """µs a call of norm + head + argmax on [rows, H], as a loop of `inner` dependent calls."""
    H = loaded.cfg.hidden_size

    def loop(params, h):
        def body(_, h):
            tok = jnp.argmax(loaded.module(params).logits(h), axis=-1)     # [rows]
            return h + (tok % 7).astype(h.dtype)[:, None] * 1e-3         # the next call depends on this one
        return jax.lax.fori_loop(0, inner, body, h)

    fn = jax.jit(loop)
    h = jax.random.normal(jax.random.key(0), (rows, H), loaded.dtype)
    jax.block_until_ready(fn(loaded.params, h))                           # compile + warm
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        jax.block_until_ready(fn(loaded.params, h))
        times.append((time.perf_counter() - t) / inner * 1e6)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama3.2-1b")
    ap.add_argument("--quantization", default="int8", help="'none' for float weights (and a float head)")
    ap.add_argument("--vocab", type=int, nargs="+", default=[32768, 65536])
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--inner", type=int, default=50)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tag", default="")
    a = ap.parse_args()
    t0 = time.perf_counter()
    hbm = measure_hbm_bandwidth()
    quant = None if a.quantization == "none" else parse_quantization(a.quantization, quantize_lm_head=True)
    full = load_model(resolve_model(a.model, "dummy"), "bfloat16", progress=False, quantization=quant)
    print(f"jax {jax.__version__} on {jax.devices()[0]}; HBM {hbm / 1e12:.2f} TB/s; {a.model} "
          f"{a.quantization}, vocab {full.cfg.vocab_size}, {a.rows} row(s)", flush=True)
    rows = []
    for n in [full.cfg.vocab_size] + a.vocab:
        loaded = full if n == full.cfg.vocab_size else prune_head(full, n)
        nbytes = head_bytes(loaded)
        us = time_head(loaded, a.rows, a.inner, a.reps)
        floor = nbytes / hbm * 1e6
        rows.append(dict(vocab=n, us=us, head_bytes=nbytes, floor_us=floor, pct_hbm=100 * floor / us))
        print(f"head over {n:>6} ids: {us:8.1f} us  ({nbytes / 1e6:7.1f} MB, floor {floor:6.1f} us, "
              f"{100 * floor / us:5.1f}% of HBM)", flush=True)
    # the peer: XLA's bf16 dot over the whole vocabulary (the float head of the same shape)
    float_full = load_model(resolve_model(a.model, "dummy"), "bfloat16", progress=False) if quant else full
    us = time_head(float_full, a.rows, a.inner, a.reps)
    print(f"peer, bf16 XLA head over {float_full.cfg.vocab_size} ids: {us:8.1f} us", flush=True)
    path = write_result("draft-head-cut", {"model": a.model, "quantization": a.quantization, "rows_m": a.rows,
                                           "hbm_tbps": hbm / 1e12, "inner": a.inner, "reps": a.reps, "rows": rows,
                                           "peer_bf16_full_us": us, "wall_s": time.perf_counter() - t0}, a.tag)
    print(f"wrote {path} in {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
