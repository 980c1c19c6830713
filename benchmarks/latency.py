"""Decode latency of the engine: batch-N steady decode tok/s, time to first token, host overhead, beside the
roofline (HBM bandwidth measured in this process) and a plain-XLA decode loop on the same shape (same run).

Batch-N decode is the steady state: the steps in which all N requests decode and none prefills (the N
requests are added together, so the first ones decode while the last ones still prefill; each asks for enough
extra tokens to give ~new_tokens such steps). Up to 2026-12-01 the figure was all steps after the first token,
prefill chunks of the other requests included (kept as with_prefill_tok_s).

Peers, per batch:
  plain_xla_tok_s   benchmarks/peers/plain_xla.py at the same batch and the steady window's mean context, run in
                    a subprocess BEFORE the engine starts (from 2026-12-02; before, in this process after the
                    engine, at context 512): at batch 256 its contiguous cache (~21 GB) does not fit beside an
                    engine holding 90% of the memory, and the engine can then use the same settings as
                    throughput.py / serving_sweep.py / startup.py, so all four share one persistent compilation
                    cache (one cold compile per GPU call instead of four).
  roofline_tok_s    batch / ((weight bytes + batch x context x KV bytes per token) / measured HBM bandwidth)

Context: requests decode from prompt_len up to prompt_len + max_tokens; the steady window runs from the last
request's first token (~extra steps in) to the first request's last (~new_tokens + extra), so its mean context is
about prompt_len + extra / 2 + new_tokens / 2 (at batch 256, prompt 512, 128 new, max_num_batched_tokens 2048:
extra 64, contexts 512-704, mean ~608).

  python benchmarks/latency.py --model llama3-8b --load-format dummy [--batch 1 16 64 256] [--profile DIR]
  python benchmarks/latency.py --model tiny-llama --batch 1 4 --prompt-len 32 --new-tokens 16 \\
      --max-model-len 256 --max-num-batched-tokens 64                       # CPU smoke test
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.common import (compilation_cache_entries,  # noqa: E402
                               maybe_profile, measure_hbm_bandwidth, write_result)
from jaxinfer import LLM, SamplingParams  # noqa: E402
from jaxinfer.config.engine import ATTENTION_BACKENDS  # noqa: E402
from jaxinfer.engine.gc_freeze import startup_objects_frozen  # noqa: E402


def extra_tokens(batch: int, prompt_len: int, max_num_batched_tokens: int) -> int:
    """Tokens each request asks beyond new_tokens: about the steps the others' prefill takes (0 at batch 1)."""
    return math.ceil(batch * prompt_len / max_num_batched_tokens) if batch > 1 else 0


def run_batch(llm, batch: int, prompt_len: int, new_tokens: int, max_num_batched_tokens: int, seed: int = 0):
    """Runs `batch` requests added together. Returns a dict:
      ttft_s          time to the first request's first token
      decode_tok_s    output tokens after each request's first / time of all steps after the first token (the
                      figure up to 2026-12-01: at batch > 1 most of those steps also carry other requests'
                      prefill chunks, so it is NOT the batch-N decode rate)
      step_s_median   median of those steps
      steady_tok_s    batch-N decode: batch x steps / time of the steps in which every one of the `batch`
                      requests decoded and none prefilled (a step whose predecessor also returned a token for
                      all of them); each request asks for enough extra tokens (prefill steps of the others) that
                      about `new_tokens` such steps happen (fewer where max_model_len cuts them)
      steady_step_s   their median; steady_steps: how many there were"""
    eng = llm.engine
    rng = np.random.default_rng(seed)
    vocab = llm.model_config.vocab_size
    want = new_tokens + extra_tokens(batch, prompt_len, max_num_batched_tokens)
    sp = SamplingParams(max_tokens=min(want, eng.max_model_len - prompt_len), temperature=0.0, ignore_eos=True)
    t_add = time.perf_counter()
    for i in range(batch):
        eng.add_request(f"b{batch}-{i}", rng.integers(0, vocab, prompt_len).tolist(), sp)
    t_first, step_times, steady, prev_all = None, [], [], False
    with startup_objects_frozen():  # as LLM.generate does: no full-heap GC pauses in the loop
        while eng.has_unfinished():
            t0 = time.perf_counter()
            outs = eng.step()
            t1 = time.perf_counter()
            all_decoded = len(outs) == batch
            if all_decoded and prev_all:
                steady.append(t1 - t0)
            prev_all = all_decoded
            if t_first is None and outs:
                t_first = t1
            elif t_first is not None:
                step_times.append(t1 - t0)
    tokens = batch * (sp.max_tokens - 1)
    nan = float("nan")
    return dict(ttft_s=t_first - t_add, decode_tok_s=tokens / sum(step_times),
                step_s_median=float(np.median(step_times)),
                steady_tok_s=batch * len(steady) / sum(steady) if steady else nan,
                steady_step_s=float(np.median(steady)) if steady else nan, steady_steps=len(steady))


def steady_context(batch: int, prompt_len: int, new_tokens: int, max_num_batched_tokens: int,
                   max_model_len: int) -> int:
    """Mean context of the steady window (module docstring), clipped below max_model_len."""
    ctx = prompt_len + extra_tokens(batch, prompt_len, max_num_batched_tokens) // 2 + new_tokens // 2
    return min(ctx, max_model_len - 2)


def device_only_step_s(llm, batch: int, ctx: int, iters: int = 20) -> float:
    """Time of the compiled decode step alone for `batch` decode rows at context `ctx` (no host work between
    steps). Run at the mean context of the measured decode so the two are comparable."""
    from jaxinfer.outputs import SeqInput
    from jaxinfer.runner.batch import pack

    r = llm.runner
    pages = [list(range(1 + i * (ctx // r.page_size + 1), 1 + (i + 1) * (ctx // r.page_size + 1)))
             for i in range(batch)]
    seqs = [SeqInput(token_ids=[1], start_pos=ctx, page_table=p) for p in pages]
    hb = pack(seqs, r.ladder.pick(batch, batch), r.page_size)
    step = r.step_program(hb)  # the program the engine runs for these (greedy) rows
    ints, floats = jax.device_put(hb.flat())
    for _ in range(3):
        out, _ = r.run_compiled(step, ints, floats)
    jax.block_until_ready(out)
    t0 = time.perf_counter()
    for _ in range(iters):
        out, _ = r.run_compiled(step, ints, floats)
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / iters


def device_only_or_nan(llm, batch: int, ctx: int) -> tuple[float, str | None]:
    """device_only_step_s, or (nan, the error) when the runner's internals it drives have changed: the decode
    figures of the run must not be lost to this side measurement; the error is printed and kept in the JSON."""
    try:
        return device_only_step_s(llm, batch, ctx), None
    except Exception as e:  # noqa: BLE001 - recorded, never hidden
        msg = f"{type(e).__name__}: {e}"[:500]
        print(f"device-only step at batch {batch}, context {ctx} failed: {msg}", flush=True)
        return float("nan"), msg


def plain_xla_peer(a, contexts: list[int]) -> dict[int, float]:
    """benchmarks/peers/plain_xla.py in a subprocess (it must finish before this process touches the device:
    each JAX process preallocates most of the GPU memory). Returns {batch: tok/s}; empty when it failed (the
    failure is printed with its output)."""
    import json
    import subprocess

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [sys.executable, "-m", "benchmarks.peers.plain_xla", "--model", a.model, "--load-format", a.load_format,
           "--batch", *map(str, a.batch), "--context", *map(str, contexts)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=repo, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", "")))
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        print(f"plain-XLA peer failed (exit {p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}", flush=True)
        return {}
    r = json.loads(lines[-1])
    print(f"plain-XLA peer (subprocess, {time.perf_counter() - t0:.1f} s): " + ", ".join(
        f"batch {b} ctx {c}: {t:.1f} tok/s" for b, c, t in zip(r["batch"], r["context"], r["tok_s"])), flush=True)
    return dict(zip(r["batch"], r["tok_s"]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--load-format", default="dummy")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64, 256])
    # the defaults are throughput.py's / serving_sweep.py's / startup.py's: same programs, one compilation cache
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--max-num-seqs", type=int, default=256, help="at least the largest --batch")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    ap.add_argument("--attention-backend", default="auto", choices=list(ATTENTION_BACKENDS))
    ap.add_argument("--page-size", type=int, default=16, help="tokens per KV page (the engine's page_size)")
    ap.add_argument("--min-bucket-tokens", type=int, default=None,
                    help="KernelConfig.min_bucket_tokens: tokens of the smallest step shape (batch 1 pads to it)")
    ap.add_argument("--tag", default="", help="appended to the result file's name")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--device-only-context", type=int, default=None,
                    help="also time the device-only step of every batch at this context (e.g. 704, issue 17's "
                         "batch-64 figure), besides the steady window's mean context")
    ap.add_argument("--profile", default=None, help="write a jax.profiler trace of the batch-1 run here")
    ap.add_argument("--host-profile", action="store_true",
                    help="cProfile the host side of the largest batch's run and print where host time goes")
    a = ap.parse_args()
    if a.max_num_seqs < max(a.batch):
        raise SystemExit(f"--max-num-seqs {a.max_num_seqs} is below the largest --batch {max(a.batch)}; raise it")
    for b in a.batch:
        need = a.prompt_len + a.new_tokens + extra_tokens(b, a.prompt_len, a.max_num_batched_tokens)
        if need > a.max_model_len:
            print(f"note: batch {b} wants context {need} > --max-model-len {a.max_model_len}: max_tokens is cut, "
                  f"so fewer than --new-tokens steady steps (raise --max-model-len or --max-num-batched-tokens)")
    ctxs = [steady_context(b, a.prompt_len, a.new_tokens, a.max_num_batched_tokens, a.max_model_len)
            for b in a.batch]
    peers = {} if a.no_peer else plain_xla_peer(a, ctxs)  # first: before this process takes the device

    bw = measure_hbm_bandwidth()
    cache_before = compilation_cache_entries()
    t0 = time.perf_counter()
    llm = LLM(a.model, load_format=a.load_format, max_model_len=a.max_model_len,
              max_num_batched_tokens=a.max_num_batched_tokens, max_num_seqs=a.max_num_seqs,
              gpu_memory_utilization=a.gpu_memory_utilization, attention_backend=a.attention_backend,
              min_bucket_tokens=a.min_bucket_tokens, page_size=a.page_size)
    startup = time.perf_counter() - t0
    background_s = llm.runner.finish_background_compiles()  # steady state: no compile beside the steps
    weight_bytes = llm.model.num_bytes
    kv_tok = llm.runner.bytes_per_page / llm.runner.page_size  # K + V of all layers, one token
    roof1 = bw / (weight_bytes + ctxs[0] * kv_tok)
    print(f"device {jax.devices()[0].device_kind}; HBM {bw / 1e12:.2f} TB/s; weights {weight_bytes / 1e9:.2f} GB; "
          f"KV {kv_tok / 1024:.0f} KiB/token; batch-1 roofline {roof1:.0f} tok/s; LLM() {startup:.1f} s "
          f"({cache_before} compilation-cache entries before: {'cold' if cache_before == 0 else 'warm'}); "
          f"KV pages {llm.runner.num_pages}; then {background_s:.1f} s for background compiles", flush=True)
    rows = []
    for b, ctx in zip(a.batch, ctxs):
        prof = None
        if a.host_profile and b == max(a.batch):
            import cProfile
            prof = cProfile.Profile()
            prof.enable()
        with maybe_profile(a.profile if b == a.batch[0] else None):
            r = run_batch(llm, b, a.prompt_len, a.new_tokens, a.max_num_batched_tokens)
        if prof is not None:
            import pstats
            prof.disable()
            print(f"--- host profile, batch {b} (cProfile slows the host; read the shares, not the times)")
            pstats.Stats(prof).sort_stats("tottime").print_stats(22)
        dev, dev_err = device_only_or_nan(llm, b, ctx)
        dev_fixed = None
        if a.device_only_context:
            dev_fixed = device_only_or_nan(llm, b, min(a.device_only_context, llm.engine.max_model_len - 2))[0]
        peer = peers.get(b)
        tps = r["steady_tok_s"]
        roof_step = (weight_bytes + b * ctx * kv_tok) / bw
        row = dict(batch=b, ttft_ms=r["ttft_s"] * 1e3, decode_tok_s=tps, step_ms_median=r["steady_step_s"] * 1e3,
                   steady_steps=r["steady_steps"], context=ctx, device_step_ms=dev * 1e3,
                   host_overhead=max(0.0, 1 - dev / r["steady_step_s"]) if dev == dev else None,
                   roofline_step_ms=roof_step * 1e3, roofline_tok_s=b / roof_step,
                   pct_roofline=100 * tps * roof_step / b, device_step_vs_roofline=dev / roof_step,
                   weight_TBps=tps / b * weight_bytes / 1e12, plain_xla_tok_s=peer,
                   engine_vs_plain_xla=tps / peer if peer else None,
                   with_prefill_tok_s=r["decode_tok_s"], with_prefill_step_ms_median=r["step_s_median"] * 1e3)
        if dev_err:
            row["device_step_error"] = dev_err
        if dev_fixed is not None:
            row[f"device_step_ms_ctx{a.device_only_context}"] = dev_fixed * 1e3
        rows.append(row)
        host = "n/a" if row["host_overhead"] is None else f"{100 * row['host_overhead']:.1f}%"
        fixed = f", at ctx {a.device_only_context} {dev_fixed * 1e3:.2f} ms" if dev_fixed is not None else ""
        print(f"batch {b:3d}: decode {tps:8.1f} tok/s ({tps / b:6.1f}/user; {r['steady_steps']} steps with all {b} "
              f"decoding, ctx ~{ctx}) | roofline {row['roofline_tok_s']:.0f} tok/s -> {row['pct_roofline']:.0f}% | "
              f"plain XLA {peer or float('nan'):.1f} tok/s -> engine {row['engine_vs_plain_xla'] or float('nan'):.2f}x"
              f" | step {r['steady_step_s'] * 1e3:.2f} ms, device-only {dev * 1e3:.2f} ms ({dev / roof_step:.2f}x "
              f"its {roof_step * 1e3:.2f} ms roofline{fixed}) -> host overhead {host} | TTFT "
              f"{r['ttft_s'] * 1e3:.1f} ms | all steps after the first token: {r['decode_tok_s']:.1f} tok/s",
              flush=True)
        # written after every batch, so a run cut short keeps its finished rows
        path = write_result("latency", dict(
            model=a.model, attention_backend=a.attention_backend, prompt_len=a.prompt_len,
            new_tokens=a.new_tokens, config=vars(a), hbm_TBps=bw / 1e12, weight_GB=weight_bytes / 1e9,
            kv_bytes_per_token=kv_tok, startup_s=startup, background_compile_s=background_s,
            compilation_cache_entries_before=cache_before,
            num_pages=llm.runner.num_pages,
            peer_note="plain_xla_tok_s: benchmarks/peers/plain_xla.py in a subprocess before the engine, same batch "
                      "and context", rows=rows), tag=a.tag)
    print("wrote", path)


if __name__ == "__main__":
    main()
