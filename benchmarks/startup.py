"""Start-up time: from `LLM(...)` to the first generated token, in a fresh process.

Run it twice: the first run compiles every bucket (cold, unless the persistent cache already holds them), the
second loads the programs from JAX's persistent compilation cache (warm). The cache is $JAXINFER_CACHE/xla
(default ~/.cache/jaxinfer/xla); for a true cold start point JAXINFER_CACHE at a fresh directory. The JSON records
how many cache entries there were before (0: cold) and after. Issue 17's targets, printed beside: warm <= 10 s,
cold <= 60 s to the first token (the 8B shape, 8 buckets).

  JAXINFER_CACHE=$(mktemp -d) sh -c 'python benchmarks/startup.py --label cold && python benchmarks/startup.py --label warm'
  python benchmarks/startup.py --model tiny-llama --max-model-len 256 --max-num-seqs 8 \\
      --max-num-batched-tokens 64 --label smoke                                      # CPU smoke test
"""
from __future__ import annotations

import argparse
import os
import sys
import time

t_process = time.perf_counter()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", default="run")
    from benchmarks.common import add_engine_flags, add_profile_arg, engine_config, start_profile
    add_engine_flags(ap, model="llama3-8b", load_format="dummy", max_model_len=2048)
    add_profile_arg(ap)
    a = ap.parse_args()
    start_profile(a.profile)
    from benchmarks.common import compilation_cache_entries, write_result

    cache_before = compilation_cache_entries()
    t0 = time.perf_counter()
    from jaxinfer import LLM, SamplingParams

    llm = LLM(config=engine_config(a), progress=False)
    t_ready = time.perf_counter()
    llm.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=1), use_tqdm=False)
    t_first = time.perf_counter()
    r = dict(label=a.label, import_s=t0 - t_process, llm_init_s=t_ready - t0, to_first_token_s=t_first - t0,
             process_to_first_token_s=t_first - t_process, buckets=len(llm.runner.ladder.buckets),
             num_pages=llm.runner.num_pages,
             compilation_cache_dir=os.path.join(os.environ.get("JAXINFER_CACHE", "~/.cache/jaxinfer"), "xla"),
             compilation_cache_entries_before=cache_before,
             compilation_cache_entries_after=compilation_cache_entries())
    kind = "cold" if cache_before == 0 else "warm"
    target = {"cold": "target <= 60 s", "warm": "target <= 10 s"}[kind]
    print(f"startup ({a.label}, {kind}: {cache_before} -> {r['compilation_cache_entries_after']} cache entries): "
          f"LLM() {r['llm_init_s']:.1f} s, to first token {r['to_first_token_s']:.1f} s ({target}; "
          f"{r['process_to_first_token_s']:.1f} s from the process start) ({r['buckets']} buckets)", flush=True)
    write_result(f"startup-{a.label}", dict(model=a.model, config=vars(a), **r))


if __name__ == "__main__":
    main()
