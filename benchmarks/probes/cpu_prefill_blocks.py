"""CPU prefill time of the default model by prompt length, the reference attention's dynamic loop in blocks of
TILE_BLOCK query tiles (d1b3755) against one block of all the bucket's tiles (the form before), alternating rounds
of one process each so a busy box slows both alike.

--twins: the prefill twins (runner/buckets.py prefill_buckets: for a step of few sequences in a decode-shaped
bucket, the same tokens with T / 16 sampled rows and 16-token tiles) on vs off, both in blocks of 16.

A bucket's tile count is its worst case (ceil(T / Bq) + S tiles: a tile for every sequence beside the tokens' own),
and a step uses a prefix of them: a 230-token prompt 58 of the 256-token bucket's 320. The one-block form gathered
every tile's KV chunk; the blocked form stops after the last used tile.

  python benchmarks/probes/cpu_prefill_blocks.py [--lengths 40 230 900] [--rounds 2] [--reps 5] [--blocks 16] \\
      [--batches 16 64] [--twins]
Result: benchmarks/results/cpu-prefill-blocks-<commit>-cpu-<date>.json (git add -f).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def child(block: int, twins: bool, lengths: list[int], reps: int, batches: list[int]) -> dict:
    """One process: prefill (max_tokens=1) of each length, median of `reps` fresh prompts (no prefix-cache hit)."""
    import pallas_kernels.paged_attention.reference as ref
    ref.TILE_BLOCK = block  # (read when the step programs are traced, below)
    from jaxinfer import LLM, SamplingParams
    llm = LLM(prefill_buckets=twins)
    llm.runner.finish_background_compiles()  # (the twins compile after warm-up)
    sp = SamplingParams(max_tokens=1, temperature=0.0)
    out = {}
    for n in lengths:
        # (a first token of each length's own: no length reads another's pages from the prefix cache)
        ids = [(7 * j + 13 * n) % 4000 + 100 for j in range(n)]
        llm.generate([ids], sp, use_tqdm=False)  # (this bucket's first run)
        ts = []
        for r in range(reps):
            t0 = time.perf_counter()
            llm.generate([[ids[0] + r + 1] + ids[1:]], sp, use_tqdm=False)
            ts.append(time.perf_counter() - t0)
        out[n] = 1e3 * statistics.median(ts)
    gen = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    for b in batches:  # b prompts of 20-26 tokens, 32 tokens each: tok/s of the whole generate (prefill included)
        prompts = [[(7 * j + i) % 4000 + 100 for j in range(20 + i % 7)] for i in range(b)]
        llm.generate(prompts, gen, use_tqdm=False)
        ts = []
        for r in range(2):
            t0 = time.perf_counter()
            llm.generate([[p[0] + r + 1] + p[1:] for p in prompts], gen, use_tqdm=False)
            ts.append(time.perf_counter() - t0)
        out[f"batch {b} tok/s"] = b * 32 / min(ts)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[40, 230, 900])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batches", type=int, nargs="*", default=[16, 64], help="also: tok/s of B 32-token generations")
    ap.add_argument("--blocks", type=int, nargs="+", default=[16], help="TILE_BLOCK values to run beside one block")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tag", default="")
    ap.add_argument("--twins", action="store_true",
                    help="instead: the prefill twins (runner/buckets.py prefill_buckets) on vs off, blocks of 16")
    ap.add_argument("--child", type=int, nargs=2, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        print(json.dumps(child(a.child[0], bool(a.child[1]), a.lengths, a.reps, a.batches)))
        return
    from benchmarks.common import write_result
    if a.twins:
        forms = {"twins": (16, 1), "no twins": (16, 0)}
        base_form = "no twins"
    else:
        forms = {f"blocks of {b} tiles": (b, 0) for b in a.blocks}
        forms["one block (before)"] = (1 << 30, 0)
        base_form = "one block (before)"
    runs = {name: [] for name in forms}
    for _ in range(a.rounds):
        for name, (block, twins) in forms.items():
            # a program cache of each form's own: its key digests the source, not this module-level switch
            cache = os.path.join(tempfile.gettempdir(), f"cpu-prefill-blocks-{block}-{twins}")
            env = dict(os.environ, JAXINFER_CACHE=cache)
            cmd = [sys.executable, __file__, "--child", str(block), str(twins), "--reps", str(a.reps),
                   "--lengths", *map(str, a.lengths), "--batches", *map(str, a.batches)]
            p = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
            runs[name].append({(int(k) if k.isdigit() else k): v
                               for k, v in json.loads(p.stdout.strip().splitlines()[-1]).items()})
    rows = []
    for n in a.lengths:
        row = {"prompt_tokens": n, **{name: min(r[n] for r in runs[name]) for name in forms}}
        rows.append(row)
        base = row[base_form]
        print(f"prompt {n:5d}: " + "   ".join(f"{k} {row[k]:8.1f} ms (x{base / row[k]:.2f})" for k in forms))
    for b in a.batches:
        k = f"batch {b} tok/s"
        row = {"batch": b, **{name: max(r[k] for r in runs[name]) for name in forms}}
        rows.append(row)
        print(f"batch {b:4d}, 32 tokens each: " + "   ".join(f"{n} {row[n]:7.1f} tok/s" for n in forms))
    print("load", [round(x, 2) for x in os.getloadavg()])
    print("wrote", write_result("cpu-prefill-blocks", dict(model="default (SmolLM2-135M-Instruct GGUF, float32)",
                                                           rows=rows, runs=runs, load=os.getloadavg()),
                                   tag=a.tag or ("twins" if a.twins else "")))


if __name__ == "__main__":
    main()
