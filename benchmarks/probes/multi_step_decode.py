"""What would k decode steps per dispatch buy? (issue 20: is batch-1 quantized decode host-bound?)

The question (12-05): the int4 'mosaic-int4' batch-1 step took 3.62 ms of engine loop time on the H200
(results/quantized-decode-mosaic-int4-2026-12-05.json), about the host time of one dispatch at batch 1 (12-04: 3.77
ms, of which the compiled call ~3 ms), while its weights stream in ~1.3 ms. This probe runs the target model's own k
greedy decode steps as ONE program (runner/draft_steps.py's FusedDraftSteps on the engine's runner: one pack, one
transfer, one launch per k tokens) and reports the time per token beside the engine's one-step-per-dispatch decode
of the same model in the same process.
The answer (H100, results/multi-step-decode-2026-12-05.json): no. k = 1 unoverlapped (7.46 ms for int8) against the
engine's 4.23 ms says the engine's step is device-bound at batch 1, and the k = 8 program took 6-7 ms a token:
unrolling steps into one program does not amortise the call (benchmarks/README.md, 2026-12-05).

  per method (bf16 | int8 | int4 | int4:<backend>), per batch b and k:
    engine      : LLM.engine decode, one step per dispatch (benchmarks/latency.py run_batch, median step)
    k-step      : back-to-back dispatches of the k-step program, each fetched before the next (like an engine
                  that reads every burst's tokens), context ~--context; time per generated token per sequence

  python benchmarks/probes/multi_step_decode.py [--methods bf16 int8 int4:mosaic-int4] [--batch 1 16] [--k 1 4 8]
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402

from benchmarks.common import measure_hbm_bandwidth, write_result  # noqa: E402


def k_step_rate(llm, batch: int, k: int, context: int, rounds: int) -> dict:
    from jaxinfer.outputs import SeqInput
    from jaxinfer.runner.draft_steps import FusedDraftSteps

    r = llm.runner
    fused = FusedDraftSteps(r, k)
    per = (context + k * (rounds + 4)) // r.page_size + 2
    tables = [list(range(1 + i * per, 1 + (i + 1) * per)) for i in range(batch)]
    assert tables[-1][-1] < r.num_pages, "KV pool too small for the probe"
    t0 = time.perf_counter()
    last = [1] * batch
    pos = context

    def one(pos, last):
        seqs = [SeqInput(token_ids=[last[i]], start_pos=pos, page_table=tables[i]) for i in range(batch)]
        toks = fused.fetch(fused.dispatch(seqs, [k] * batch))  # [k, max_num_seqs]
        return pos + k, toks[-1, :batch].tolist()

    pos, last = one(pos, last)  # compiles
    compile_s = time.perf_counter() - t0
    for _ in range(2):
        pos, last = one(pos, last)
    t0 = time.perf_counter()
    for _ in range(rounds):
        pos, last = one(pos, last)
    dt = (time.perf_counter() - t0) / rounds
    return dict(k=k, batch=batch, ms_per_dispatch=dt * 1e3, ms_per_token=dt * 1e3 / k,
                tok_s=batch * k / dt, compile_s=compile_s)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--methods", nargs="+", default=["bf16", "int8", "int4:mosaic-int4"])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--k", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=24)
    ap.add_argument("--engine-tokens", type=int, default=128)
    ap.add_argument("--budget-s", type=float, default=500)
    ap.add_argument("--tag", default="")
    a = ap.parse_args()
    from benchmarks.latency import run_batch
    from jaxinfer import LLM

    smoke = jax.default_backend() == "cpu"
    if smoke:
        a.model, a.context, a.rounds, a.engine_tokens = "tiny-llama", 32, 4, 8
    t_start = time.perf_counter()
    bw = measure_hbm_bandwidth(0.05 if smoke else 2.0, 3 if smoke else 20)
    rows = []
    for method in a.methods:
        if time.perf_counter() - t_start > a.budget_s:
            rows.append(dict(method=method, skipped="time budget"))
            continue
        quant, _, backend = method.partition(":")
        llm = LLM(a.model, load_format="dummy", max_model_len=1024, max_num_seqs=max(max(a.batch), 16),
                  num_pages=4000 if not smoke else 400, quantization=None if quant == "bf16" else quant,
                  quantized_matmul=backend or "auto", progress=False)
        llm.runner.finish_background_compiles()
        row = dict(method=method, weight_GB=llm.model.num_bytes / 1e9, roofline_ms=llm.model.num_bytes / bw * 1e3)
        for b in a.batch:
            run_batch(llm, b, 128, 8, 2048)  # untimed: first executions
            e = run_batch(llm, b, 128 if not smoke else 16, a.engine_tokens, 2048)
            row[f"engine_b{b}_step_ms"] = e["step_s_median"] * 1e3
            print(f"{method:<18} b{b:<3} engine   median step {e['step_s_median'] * 1e3:6.2f} ms "
                  f"({b / e['step_s_median']:8.1f} tok/s); weights at {bw / 1e12:.2f} TB/s: "
                  f"{row['roofline_ms']:.2f} ms", flush=True)
            for k in a.k:
                if time.perf_counter() - t_start > a.budget_s:
                    break
                res = k_step_rate(llm, b, k, a.context, a.rounds)
                row[f"k{k}_b{b}"] = res
                print(f"{method:<18} b{b:<3} k={k:<2}    {res['ms_per_dispatch']:6.2f} ms a dispatch = "
                      f"{res['ms_per_token']:5.2f} ms a token ({res['tok_s']:8.1f} tok/s; "
                      f"{100 * row['roofline_ms'] / res['ms_per_token']:.0f}% of the weight roofline; "
                      f"compile {res['compile_s']:.0f} s)", flush=True)
        rows.append(row)
        del llm
        gc.collect()
        jax.clear_caches()
    print("wrote", write_result("multi-step-decode", dict(model=a.model, hbm_Bps=bw, context=a.context, rows=rows),
                                tag=a.tag))


if __name__ == "__main__":
    main()
