"""Decode-step time with 0, 1 and all rows using penalties (presence/frequency/repetition), through the runner.

The penalty math runs under a lax.cond that is skipped when no row of the step has a penalty slot; the only
always-on cost is an S-element scatter into the count table (dropped indices). This measures the three cases on
the same compiled program (the decode bucket of --batch sequences, each with --context tokens of KV).

  python benchmarks/penalty_overhead.py                                   # H200: 8B-shaped dummy model, batch 64
  python benchmarks/penalty_overhead.py --model tiny-llama --batch 16 --context 40 --iters 200 --max-model-len 512
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--iters", type=int, default=100)
    from benchmarks.common import add_engine_flags, add_profile_arg, engine_config, start_profile
    add_engine_flags(ap, model="llama3-8b", load_format="dummy", max_model_len=2048)  # --max-num-seqs: max(batch, 16)
    add_profile_arg(ap)
    a = ap.parse_args()
    start_profile(a.profile)

    from benchmarks.common import write_result
    from jaxinfer import LLM
    from jaxinfer.outputs import SeqInput

    llm = LLM(config=engine_config(a, max_num_seqs=max(a.batch, 16)), progress=False)
    r = llm.runner
    pages = math.ceil((a.context + 1) / r.page_size)
    V = llm.model_config.vocab_size
    rng = np.random.default_rng(0)

    def seqs(n_pen):
        out = []
        for i in range(a.batch):
            s = SeqInput(token_ids=[5], start_pos=a.context, page_table=list(range(1 + i * pages, 1 + (i + 1) * pages)),
                         temperature=0.0)
            if i < n_pen:
                s.frequency_penalty, s.presence_penalty, s.repetition_penalty = 0.5, 0.3, 1.1
                s.penalty_slot = i
            out.append(s)
        return out

    for i in range(a.batch):  # counts rows as a long request would have them
        r.dispatch([SeqInput(token_ids=[5], start_pos=0, page_table=[1], penalty_init=(
            i, rng.integers(0, V, a.context).tolist(), rng.integers(0, V, 200).tolist()))])
    res = {}
    for name, n_pen in (("none", 0), ("one", 1), ("all", a.batch)):
        batch = seqs(n_pen)
        for _ in range(10):
            r.fetch(r.dispatch(batch))
        times = []
        for _ in range(a.iters):
            t0 = time.perf_counter()
            r.fetch(r.dispatch(batch))
            times.append((time.perf_counter() - t0) * 1e3)
        res[name] = {"median_ms": float(np.median(times)), "p10_ms": float(np.percentile(times, 10)),
                     "min_ms": float(np.min(times))}
        print(f"penalised rows {name:4s} ({n_pen:3d}/{a.batch}): median {res[name]['median_ms']:.3f} ms, "
              f"p10 {res[name]['p10_ms']:.3f} ms")
    path = write_result("penalty-overhead", dict(model=a.model, config=vars(a), vocab=V, results=res))
    print("wrote", path)


if __name__ == "__main__":
    main()
