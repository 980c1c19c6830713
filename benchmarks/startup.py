"""Start-up time: from `LLM(...)` to the first generated token, in a fresh process.

Run it twice: the first run compiles every bucket (cold, unless the persistent cache already holds them), the
second loads the programs from JAX's persistent compilation cache (warm).

  python benchmarks/startup.py --model llama3-8b --load-format dummy [--label warm]
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
    t0 = time.perf_counter()
    from jaxinfer import LLM, SamplingParams
    from benchmarks.common import write_result

    llm = LLM(config=engine_config(a), progress=False)
    t_ready = time.perf_counter()
    llm.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=1), use_tqdm=False)
    t_first = time.perf_counter()
    r = dict(label=a.label, import_s=t0 - t_process, llm_init_s=t_ready - t0, to_first_token_s=t_first - t0,
             buckets=len(llm.runner.ladder.buckets))
    print(f"startup ({a.label}): LLM() {r['llm_init_s']:.1f} s, to first token {r['to_first_token_s']:.1f} s "
          f"({r['buckets']} buckets)")
    write_result(f"startup-{a.label}", dict(model=a.model, config=vars(a), **r))


if __name__ == "__main__":
    main()
