"""Prefix caching on vs off: N requests sharing one long system prompt, each with its own question.

Workload (fixed seed): a --system-len-token system prompt shared by all --num-requests requests, each followed by
--question-len distinct tokens, --output-len generated tokens (ignore_eos). Token ids are random (the dummy
8B-shaped model has no tokenizer, and random ids cost the same as text). All requests are submitted at once
(offline, like vLLM's benchmark_prefix_caching), so TTFT includes the time queued behind other prefills.

One engine, both modes, in the same process: the cache is switched off for the first pass (nothing is looked up
or registered), then emptied and switched on for the second pass, so both use the same weights, the same
compiled programs and the same KV pool. The "on" pass starts cold: the system prompt is computed by the first
request(s) admitted before its pages are registered (pages become reusable once their step has come back).

  python benchmarks/prefix_caching.py                                        # H200: 8B-shaped dummy model
  python benchmarks/prefix_caching.py --model tiny-llama --num-requests 16 --system-len 200 \\
      --question-len 10 --output-len 4 --max-model-len 512                 # CPU smoke test

Targets (issue 9): TTFT p50 at least 5x lower with caching, throughput at least 2x higher.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402


def make_workload(n, system_len, question_len, vocab, seed=0):
    rng = np.random.default_rng(seed)
    system = rng.integers(0, vocab, system_len).tolist()
    return [system + rng.integers(0, vocab, question_len).tolist() for _ in range(n)]


def run_pass(engine, prompts, output_len, tag):
    """Submit everything at once, step to completion; per-request TTFT from the engine's own timestamps."""
    from jaxinfer import SamplingParams

    sp = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    for i, p in enumerate(prompts):
        engine.add_request(f"{tag}{i}", p, sp)
    ttft, n_out = [], 0
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                m = out.metrics
                ttft.append(m["first_token_time"] - m["arrival_time"])
                n_out += len(out.outputs[0].token_ids)
    wall = time.perf_counter() - t0
    assert len(ttft) == len(prompts) and n_out == output_len * len(prompts)
    n_in = sum(len(p) for p in prompts)
    pc = engine.prefix_cache_stats()
    return {"seconds": wall, "req_per_s": len(prompts) / wall, "output_tok_per_s": n_out / wall,
            "total_tok_per_s": (n_in + n_out) / wall,
            "ttft_ms": {f"p{q}": float(np.percentile(ttft, q)) * 1e3 for q in (50, 90, 99)},
            "prefix_cache": pc}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-requests", type=int, default=200)
    ap.add_argument("--system-len", type=int, default=2000)
    ap.add_argument("--question-len", type=int, default=100)
    ap.add_argument("--output-len", type=int, default=32)
    from benchmarks.common import add_engine_flags, add_profile_arg, engine_config, start_profile
    add_engine_flags(ap, model="llama3-8b", load_format="dummy", max_model_len=4096)
    add_profile_arg(ap)
    a = ap.parse_args()
    start_profile(a.profile)

    import jax
    from benchmarks.common import write_result
    from jaxinfer import LLM

    t0 = time.perf_counter()
    llm = LLM(config=engine_config(a, enable_prefix_caching=True))
    startup = time.perf_counter() - t0
    eng = llm.engine
    prompts = make_workload(a.num_requests, a.system_len, a.question_len, llm.model_config.vocab_size)
    print(f"device {jax.devices()[0].device_kind}; startup {startup:.1f} s; KV pages {llm.runner.num_pages}")

    rows = {}
    for mode in ("off", "on"):
        eng.kv.reset_prefix_cache()  # nothing runs between passes: no page is shared
        eng.kv.enable_prefix_caching = mode == "on"
        before = eng.prefix_cache_stats()
        r = run_pass(eng, prompts, a.output_len, mode)
        r["prefix_cache"] = {k: r["prefix_cache"][k] - before[k] for k in ("queries", "hits", "hit_requests")}
        q = r["prefix_cache"]["queries"]
        r["prefix_cache"]["hit_rate"] = r["prefix_cache"]["hits"] / q if q else 0.0
        rows[mode] = r
        print(f"cache {mode:3s}: {r['seconds']:.1f} s, {r['req_per_s']:.2f} req/s, {r['total_tok_per_s']:.0f} "
              f"total tok/s | TTFT p50 {r['ttft_ms']['p50']:.0f} ms p90 {r['ttft_ms']['p90']:.0f} ms | "
              f"hit rate {r['prefix_cache']['hit_rate']:.3f}")
    ttft_x = rows["off"]["ttft_ms"]["p50"] / rows["on"]["ttft_ms"]["p50"]
    tput_x = rows["on"]["req_per_s"] / rows["off"]["req_per_s"]
    verdict = {"ttft_p50_speedup": ttft_x, "ttft_target_5x_met": ttft_x >= 5.0,
               "throughput_speedup": tput_x, "throughput_target_2x_met": tput_x >= 2.0}
    print(f"TTFT p50 {ttft_x:.1f}x lower (target >= 5x: {'met' if ttft_x >= 5 else 'NOT met'}); "
          f"throughput {tput_x:.2f}x (target >= 2x: {'met' if tput_x >= 2 else 'NOT met'})")
    path = write_result("prefix-caching", dict(model=a.model, startup_s=startup, config=vars(a),
                                               workload="random token ids (dummy model): shared system prompt + "
                                                        "distinct question per request, all submitted at once",
                                               method="one engine; pass 1 cache off, pass 2 cache reset and on",
                                               results=rows, **verdict))
    print("wrote", path)


if __name__ == "__main__":
    main()
