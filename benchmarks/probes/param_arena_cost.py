"""Host time of the step's call with the norm scales packed into one buffer a dtype (runner/param_arena.py) against
the flat list of weights, same model, same bucket, alternating rounds in one process.

`--model tiny32` (default) is the tiny-llama preset with 32 layers: the 8B's number of argument buffers (195 weight
matrices and vectors, 64 KV pools) with a device program cheap enough for the CPU; on a GPU `--model llama3-8b`.
Per round: the 25th percentile of the call's thread time (time.thread_time around ModelRunner.run_compiled, the
greedy program of the smallest bucket) over --calls calls; printed per round and as the median of the rounds.

  PYTHONPATH=$PWD python benchmarks/probes/param_arena_cost.py [--model tiny32] [--rounds 14] [--calls 100]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

import jaxinfer  # noqa: E402
from benchmarks.common import write_result  # noqa: E402
from jaxinfer.runner.model_runner import ModelRunner  # noqa: E402
from jaxinfer.weights import presets  # noqa: E402

presets.PRESETS.setdefault("tiny32", {**presets.PRESETS["tiny-llama"], "num_hidden_layers": 32})


def runner(model: str, arena: bool, memory_fraction: float):
    """memory_fraction: gpu_memory_utilization, which counts everything the process holds (the second of two
    8B engines needs ~0.45 more than the first). arena False: the step as before the arena (the flat weights list)."""
    ModelRunner.pack_norm_scales = arena
    try:
        llm = jaxinfer.LLM(model=model, load_format="dummy", max_num_seqs=8, max_model_len=256, warmup=False,
                           progress=False, gpu_memory_utilization=memory_fraction)
    finally:
        ModelRunner.pack_norm_scales = True
    r = llm.runner
    bucket = r.ladder.buckets[0]
    ints, floats = r.placeholder_batch(bucket)
    return llm, r, r.compile_step(bucket, greedy_only=True), ints, floats


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny32")
    ap.add_argument("--rounds", type=int, default=14)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--tag", default="")
    a = ap.parse_args()
    sides = {name: runner(a.model, name == "arena", frac) for name, frac in (("arena", 0.4), ("flat", 0.85))}
    buffers = {name: len(jax.tree.leaves(s[1].step_params)) for name, s in sides.items()}
    print("weight buffers a call:", buffers, flush=True)
    rounds = {name: [] for name in sides}
    for _ in range(a.rounds):
        for name, (_, r, step, ints, floats) in sides.items():
            out, _ = r.run_compiled(step, ints, floats)
            jax.block_until_ready(out)
            ts = []
            for _ in range(a.calls):
                t0 = time.thread_time()
                out, _ = r.run_compiled(step, ints, floats)
                ts.append(time.thread_time() - t0)
            jax.block_until_ready(out)
            rounds[name].append(float(np.percentile(ts, 25)) * 1e6)
    med = {name: statistics.median(v) for name, v in rounds.items()}
    for name in sides:
        print(f"{name:6s} call thread time, µs (25th pct per round): median {med[name]:.1f} | "
              f"{[round(x) for x in rounds[name]]}", flush=True)
    print(f"arena saves {med['flat'] - med['arena']:.1f} µs a call "
          f"({buffers['flat'] - buffers['arena']} fewer buffers)", flush=True)
    write_result("param-arena-cost", dict(model=a.model, buffers=buffers, rounds_us=rounds, median_us=med),
                 tag=a.tag)


if __name__ == "__main__":
    main()
