"""Quantized weights in the engine on the 8B shape (random weights): batch-1 decode tok/s of bf16 vs int8 vs int4
(vs the HBM roofline of each model's weight bytes), offline throughput of bf16 vs fp8 W8A8 (and the others), and
the device bytes of each model's weights (int4 with and without a quantized LM head).

One LLM per method, loaded with load_format="dummy" (the float random weights are generated and quantized on the
device one tensor at a time; the same seed gives the same float weights for every method), then:
  decode     : batch 1, prompt --prompt-len, --new-tokens greedy tokens (benchmarks/latency.py's run_batch)
  throughput : --num-requests requests of --prompt-len / --output-len tokens submitted at once (throughput.py)
Targets (issue 7): int8 >= 1.6x and int4 >= 2.5x bf16 batch-1 tok/s; fp8 W8A8 offline throughput >= 1.3x bf16;
int4 weights of the 8B model < 5.5 GB on the device; KV fp8 doubles the concurrent 2k-token requests that fit
(`kv_capacity`: the page pool the engine sizes from free memory, bf16 vs fp8 KV, weights bf16).

  python benchmarks/quantized_decode.py                 # H200, < 8 min
  python benchmarks/quantized_decode.py --smoke         # CPU: tiny-llama preset, a few tokens
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402

from benchmarks.common import measure_hbm_bandwidth, write_result  # noqa: E402
from pallas_kernels.quantized_matmul import mosaic_int4_wide  # noqa: E402
from benchmarks.latency import device_only_or_nan, run_batch  # noqa: E402
from benchmarks.throughput import make_workload, run_engine  # noqa: E402
from jaxinfer import LLM  # noqa: E402


def weight_breakdown(loaded) -> dict:
    """Device bytes of the weights by role (GB)."""
    out = {"quantized_linears": 0, "float_linears": 0, "embed": 0, "lm_head": 0, "other": 0}
    state = jax.tree.unflatten(loaded.treedef, loaded.params)
    for path, leaf in jax.tree_util.tree_leaves_with_path(state):
        n = (int(leaf.size) * (4 if leaf.dtype.name in ("int4", "uint4") else 8 * leaf.dtype.itemsize) + 7) // 8
        keys = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]
        last = next((k for k in reversed(keys) if k in ("q", "scale", "offset", "w", "b")), "")
        if keys and keys[0] == "embed":
            out["embed"] += n
        elif keys and keys[0] == "lm_head":
            out["lm_head"] += n
        elif last in ("q", "scale", "offset"):
            out["quantized_linears"] += n
        elif last in ("w", "b"):
            out["float_linears"] += n
        else:
            out["other"] += n
    return {k: v / 1e9 for k, v in out.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--methods", nargs="+", default=["bf16", "int8", "int4", "fp8", "int8:w8a8", "int4:xla-int4"],
                    help="bf16 | int8 | int4[-g64|-asym...] | fp8, then optionally ':<quantized_matmul backend>' "
                         "(w8a8, xla-int4, pallas, xla) and '+head' (the LM head in the model's method) or "
                         "'+floathead' (a float head; default: int8 head for int8 / int4), and '@yt' / '@tout' (int4 "
                         "on Hopper: the many-token kernel writes y^T for XLA to transpose / y [M, N] itself, "
                         "mosaic_int4_wide.TRANSPOSE_OUT; the default is @tout since 2026-12-05 d)")
    ap.add_argument("--throughput-methods", nargs="*", default=["bf16", "fp8", "int8"])
    ap.add_argument("--decode-batches", type=int, nargs="+", default=[1],
                    help="decode batch sizes (batch 1 always runs; e.g. 1 16 for the batch-16 target)")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--num-requests", type=int, default=384)
    ap.add_argument("--tp-prompt-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--num-pages", type=int, default=12000)
    ap.add_argument("--min-bucket-tokens", type=int, default=None,
                    help="KernelConfig.min_bucket_tokens: tokens of the smallest step shape (batch 1 pads to it)")
    ap.add_argument("--budget-s", type=float, default=430.0, help="skip the remaining methods past this time")
    ap.add_argument("--kv-capacity", action=argparse.BooleanOptionalAction, default=True,
                    help="first: concurrent --kv-request-len requests that fit with a bf16 vs an fp8 KV cache")
    ap.add_argument("--kv-request-len", type=int, default=2048)
    ap.add_argument("--smoke", action="store_true", help="CPU smoke test: tiny-llama preset")
    ap.add_argument("--tag", default="", help="appended to the result file's name")
    from benchmarks.common import add_profile_arg, start_profile
    add_profile_arg(ap)
    a = ap.parse_args()
    start_profile(a.profile)
    if a.smoke:
        a.model, a.new_tokens, a.prompt_len = "tiny-llama", 8, 8
        a.num_requests, a.tp_prompt_len, a.output_len = 4, 16, 4
        a.max_num_seqs, a.max_num_batched_tokens, a.num_pages, a.kv_request_len = 4, 64, 64, 128
        a.methods = [m.replace("int4", "int4-g32", 1) if m.startswith("int4") and "-g" not in m else m
                     for m in a.methods]
    t_start = time.perf_counter()
    bw = measure_hbm_bandwidth(0.05 if a.smoke else 2.0, 3 if a.smoke else 20)
    print(f"jax {jax.__version__} on {jax.devices()[0]}; HBM ceiling (x*2) {bw / 1e12:.2f} TB/s", flush=True)
    kv_rows = kv_capacity(a) if a.kv_capacity else None
    if any("@" in m for m in a.methods):
        # the on-disk program cache keys on the source and the config, not on TRANSPOSE_OUT: with it, "@yt" and
        # the plain method could load one another's compiled step
        os.environ["JAXINFER_PROGRAM_CACHE"] = "0"
        print("'@' methods: the program cache is off for this run", flush=True)
    rows = []
    for method in a.methods:
        if time.perf_counter() - t_start > a.budget_s:
            print(f"{method}: skipped (time budget)", flush=True)
            rows.append(dict(method=method, skipped="time budget"))
            continue
        name, _, variant = method.partition("@")
        if variant not in ("", "tout", "yt"):
            raise SystemExit(f"unknown method variant @{variant} in {method!r}; the variants are @tout and @yt")
        mosaic_int4_wide.TRANSPOSE_OUT = variant != "yt"   # read by default_config at trace time
        spec_part, _, head_part = name.partition("+")
        quant, _, backend = spec_part.partition(":")
        head = {"": None, "head": True, "floathead": False}[head_part]
        t0 = time.perf_counter()
        llm = LLM(a.model, load_format="dummy", max_model_len=1024 if not a.smoke else 256,
                  max_num_batched_tokens=a.max_num_batched_tokens, max_num_seqs=a.max_num_seqs,
                  num_pages=a.num_pages, quantization=None if quant == "bf16" else quant,
                  quantize_lm_head=None if quant == "bf16" else head, quantized_matmul=backend or "auto",
                  min_bucket_tokens=a.min_bucket_tokens, progress=False)
        row = dict(method=method, startup_s=time.perf_counter() - t0, weight_GB=llm.model.num_bytes / 1e9,
                   weights=weight_breakdown(llm.model))
        # steady state, as latency.py / throughput.py measure it: the programs LLM() compiles in the background
        # after warm-up (runner.compile_in_background) are done before the timed runs. Until 2026-12-04 this
        # benchmark did not wait, so its batch-1 means took the steps that ran beside those compiles (mean far
        # below the median: results/quantized-decode-2026-12-04.json, int4 121.4 tok/s vs a 4.74 ms median step).
        row["background_compile_wait_s"] = llm.runner.finish_background_compiles()
        run_batch(llm, 1, a.prompt_len, 8, a.max_num_batched_tokens)  # untimed: first executions of the programs
        roof = bw / llm.model.num_bytes
        r = run_batch(llm, 1, a.prompt_len, a.new_tokens, a.max_num_batched_tokens)  # batch 1: no prefill mixed in
        tps, step = r["decode_tok_s"], r["step_s_median"]
        # the compiled step alone at the run's mean context: says whether a gap between two rows (12-06 i: int8
        # after a bf16 LLM 0.26 ms a step faster than int8 as a process's first model) is device or host time
        dev, dev_err = device_only_or_nan(llm, 1, a.prompt_len + a.new_tokens // 2)
        row.update(decode_b1_tok_s=tps, step_ms_median=step * 1e3, roofline_tok_s=roof,
                   pct_roofline=100 * tps / roof, device_step_ms=dev * 1e3, device_step_error=dev_err)
        print(f"{method:<10} weights {row['weight_GB']:6.2f} GB ({row['weights']}) | batch-1 decode {tps:7.1f} tok/s "
              f"(roofline {roof:.0f}, {row['pct_roofline']:.0f}%; median step {step * 1e3:.2f} ms = {1 / step:.1f} "
              f"tok/s, device-only {dev * 1e3:.2f} ms) | startup {row['startup_s']:.0f} s", flush=True)
        for b in a.decode_batches:   # batched decode (issue 20: int4 >= 2.0x bf16 at batch 16)
            if b == 1:
                continue
            rb = run_batch(llm, b, a.prompt_len, a.new_tokens, a.max_num_batched_tokens)
            row[f"decode_b{b}_tok_s"] = rb["decode_tok_s"]
            row[f"step_ms_median_b{b}"] = rb["step_s_median"] * 1e3
            print(f"{method:<10} batch-{b} decode {rb['decode_tok_s']:8.1f} tok/s (median step "
                  f"{rb['step_s_median'] * 1e3:.2f} ms)", flush=True)
        if method in a.throughput_methods and time.perf_counter() - t_start < a.budget_s:
            work = make_workload("fixed", a.num_requests, a.tp_prompt_len, a.output_len,
                                 llm.model_config.vocab_size, 1024)
            tp = run_engine(llm, work)
            row["throughput"] = tp
            print(f"{method:<10} offline {a.num_requests} x {a.tp_prompt_len}/{a.output_len}: "
                  f"{tp['output_tok_per_s']:.0f} output tok/s, {tp['total_tok_per_s']:.0f} total tok/s "
                  f"in {tp['seconds']:.1f} s", flush=True)
        rows.append(row)
        save(a, rows, bw, t_start, kv_rows)
        del llm
        gc.collect()
        jax.clear_caches()
    path = save(a, rows, bw, t_start, kv_rows)
    print(f"wrote {path} in {time.perf_counter() - t_start:.0f} s", flush=True)


def kv_capacity(a) -> list[dict]:
    """Concurrent --kv-request-len-token requests that fit in the page pool the engine sizes from free device memory
    (gpu_memory_utilization, bf16 weights), for a bf16 and an fp8 KV cache. No compile: warmup=False."""
    rows = []
    for kv in ("auto", "fp8"):
        llm = LLM(a.model, load_format="dummy", max_model_len=a.kv_request_len, warmup=False, progress=False,
                  kv_cache_dtype=kv)
        r = llm.engine.runner
        per_request = -(-a.kv_request_len // r.page_size)
        rows.append(dict(kv_cache_dtype=kv, num_pages=r.num_pages, page_size=r.page_size,
                         bytes_per_page=r.bytes_per_page, kv_cache_GB=r.kv_cache_bytes / 1e9,
                         concurrent_requests=(r.num_pages - 1) // per_request))
        print(f"KV {kv:<5}: {r.num_pages} pages of {r.bytes_per_page} B ({r.kv_cache_bytes / 1e9:.1f} GB) -> "
              f"{rows[-1]['concurrent_requests']} concurrent {a.kv_request_len}-token requests", flush=True)
        del llm, r
        gc.collect()
    rows[1]["ratio_vs_bf16"] = rows[1]["concurrent_requests"] / rows[0]["concurrent_requests"]
    print(f"KV fp8 fits {rows[1]['ratio_vs_bf16']:.2f}x the concurrent requests of bf16 (target 2x)", flush=True)
    return rows


def save(a, rows, bw, t_start, kv_rows) -> str:
    """Speed-ups vs the bf16 row where both exist; the JSON is rewritten after every method so that a run cut by
    the device's time limit keeps what it measured."""
    base = next((r for r in rows if r.get("method") == "bf16" and "decode_b1_tok_s" in r), None)
    if base:
        for r in rows:
            if "decode_b1_tok_s" in r:
                r["decode_speedup_vs_bf16"] = r["decode_b1_tok_s"] / base["decode_b1_tok_s"]
            for b in a.decode_batches:
                if b > 1 and f"decode_b{b}_tok_s" in r and f"decode_b{b}_tok_s" in base:
                    r[f"decode_b{b}_speedup_vs_bf16"] = r[f"decode_b{b}_tok_s"] / base[f"decode_b{b}_tok_s"]
            if "throughput" in r and "throughput" in base:
                r["throughput_speedup_vs_bf16"] = (r["throughput"]["output_tok_per_s"]
                                                   / base["throughput"]["output_tok_per_s"])
        print("speed-up vs bf16: " + ", ".join(
            f"{r['method']}: decode {r.get('decode_speedup_vs_bf16', float('nan')):.2f}x"
            + (f", throughput {r['throughput_speedup_vs_bf16']:.2f}x" if "throughput_speedup_vs_bf16" in r else "")
            for r in rows if "decode_b1_tok_s" in r), flush=True)
    return write_result("quantized-decode", dict(
        model=a.model, prompt_len=a.prompt_len, new_tokens=a.new_tokens, num_requests=a.num_requests,
        tp_prompt_len=a.tp_prompt_len, output_len=a.output_len, hbm_TBps=bw / 1e12,
        wall_s=time.perf_counter() - t_start, rows=rows, kv_capacity=kv_rows), tag=a.tag)

if __name__ == "__main__":
    main()
