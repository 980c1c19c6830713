"""XLA:CPU compile options for the step programs: compile time of the two programs `jaxinfer generate --chat`
needs first (the chat prompt's bucket and the 1-token decode bucket) against the decode step's run time.

One process, the default model with the CPU defaults, no caches (program cache and JAX's persistent cache off, so
every compile is a real one). Each option set compiles the decode bucket then the prompt bucket, and times
--steps runs of the decode program on a one-token batch (device-only decode tok/s: no host work, no sampling
readback, so an upper bound of what `cpu_decode.py` measures). Sets are measured in alternating rounds; only the
first round's compiles are real (then JAX's in-memory cache serves them).

  JAXINFER_PROGRAM_CACHE=0 python benchmarks/probes/cpu_compile_options.py [--rounds 2] [--steps 40]
Result: benchmarks/results/cpu-compile-options-cpu-<date>.json
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
os.environ.setdefault("JAXINFER_PROGRAM_CACHE", "0")

SETS = {
    "default": None,
    "O1": {"xla_backend_optimization_level": 1},
    "O0": {"xla_backend_optimization_level": 0},
    "no-expensive": {"xla_llvm_disable_expensive_passes": True},
    "O1-no-expensive": {"xla_backend_optimization_level": 1, "xla_llvm_disable_expensive_passes": True},
}
PROMPT = "Write a short story about a robot who learns to paint."


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--sets", default=",".join(SETS))
    a = ap.parse_args()
    import jax

    from benchmarks.common import write_result
    from jaxinfer import LLM

    llm = LLM(progress=False, warmup=False)
    jax.config.update("jax_enable_compilation_cache", False)
    r = llm.runner
    ids = llm.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}])
    decode, prompt = r.ladder.pick(1, 1), r.ladder.pick(len(ids), 1)
    r.compile_step(r.ladder.pick(4, 1))  # one-time costs (LLVM, tracing) out of the rounds, in another bucket
    # (a compile of the same program and options is served from JAX's in-memory cache: later rounds time runs only)
    names = a.sets.split(",")
    rows = {n: [] for n in names}
    for _ in range(a.rounds):
        for n in names:
            opts = SETS[n]
            t0 = time.perf_counter()
            step = r.compile_step(decode, opts)
            t1 = time.perf_counter()
            r.compile_step(prompt, opts)
            t2 = time.perf_counter()
            ints, floats = jax.device_put(r.placeholder_batch(decode))
            out, _ = r.run_compiled(step, ints, floats)
            jax.block_until_ready(out)
            t3 = time.perf_counter()
            for _ in range(a.steps):
                out, _ = r.run_compiled(step, ints, floats)
            jax.block_until_ready(out)
            dt = (time.perf_counter() - t3) / a.steps
            rows[n].append(dict(decode_compile_s=t1 - t0, prompt_compile_s=t2 - t1, step_ms=dt * 1e3,
                                load=os.getloadavg()[0]))
            print(f"{n:18s} compile decode {t1 - t0:5.2f} s prompt({prompt.num_tokens}) {t2 - t1:5.2f} s  "
                  f"step {dt * 1e3:6.2f} ms ({1 / dt:6.1f} tok/s)  load {os.getloadavg()[0]:.2f}", flush=True)
    summary = {n: dict(decode_compile_s=statistics.median(x["decode_compile_s"] for x in v),
                       prompt_compile_s=statistics.median(x["prompt_compile_s"] for x in v),
                       step_ms=statistics.median(x["step_ms"] for x in v), options=SETS[n], runs=v)
               for n, v in rows.items()}
    print(write_result("cpu-compile-options", dict(prompt_tokens=len(ids), prompt_bucket=prompt.num_tokens,
                                                   steps=a.steps, sets=summary)))


if __name__ == "__main__":
    main()
