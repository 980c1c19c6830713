"""Decode latency of the engine: batch-1 tok/s (prompt 128, 256 new), time to first token, batch-N decode,
host overhead, beside the HBM roofline and a plain-XLA decode loop on the same weights (same process).

Batch-N decode is the steady state: the steps in which all N requests decode and none prefills (the N
requests are added together, so the first ones decode while the last ones still prefill; each asks for enough
extra tokens to give ~new_tokens such steps). Up to 2026-12-01 the figure was all steps after the first token,
prefill chunks of the other requests included (kept as with_prefill_tok_s): at batch 64 x 512 about half of those
steps carried a 256-token prefill chunk, which understated batch-N decode and inflated the host overhead.

  python benchmarks/latency.py --model llama3-8b --load-format dummy [--batch 1 16 64] [--profile DIR]
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

from benchmarks.common import (add_engine_flags, engine_config, maybe_profile, measure_hbm_bandwidth,  # noqa: E402
                               write_result)
from jaxinfer import LLM, SamplingParams  # noqa: E402
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
    step, _ = r._programs(hb.bucket)
    ints, floats = jax.device_put(hb.flat())
    for _ in range(3):
        out, _ = r.run_compiled(step, ints, floats)
    jax.block_until_ready(out)
    t0 = time.perf_counter()
    for _ in range(iters):
        out, _ = r.run_compiled(step, ints, floats)
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / iters


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--profile", default=None, help="write a jax.profiler trace of the batch-1 run here")
    ap.add_argument("--host-profile", action="store_true",
                    help="cProfile the host side of the largest batch's run and print where host time goes")
    add_engine_flags(ap, model="llama3-8b", load_format="dummy", max_model_len=1024, max_num_batched_tokens=256,
                     gpu_memory_utilization=0.6)  # --max-num-seqs is max(--batch)
    a = ap.parse_args()

    bw = measure_hbm_bandwidth()
    t0 = time.perf_counter()
    llm = LLM(config=engine_config(a, max_num_seqs=max(a.batch)))  # one step holds the largest batch
    startup = time.perf_counter() - t0
    weight_bytes = llm.model.num_bytes
    roof = bw / weight_bytes
    print(f"device {jax.devices()[0].device_kind}; HBM {bw / 1e12:.2f} TB/s; weights {weight_bytes / 1e9:.2f} GB; "
          f"batch-1 roofline {roof:.0f} tok/s; startup {startup:.1f} s")
    rows = []
    for b in a.batch:
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
        # at the steady window's mean context
        ctx = a.prompt_len + extra_tokens(b, a.prompt_len, a.max_num_batched_tokens) + a.new_tokens // 2
        dev = device_only_step_s(llm, b, min(ctx, llm.engine.max_model_len - 2))
        peer = None if a.no_peer else plain_decode(llm, b)
        tps = r["steady_tok_s"]
        row = dict(batch=b, ttft_ms=r["ttft_s"] * 1e3, decode_tok_s=tps, step_ms_median=r["steady_step_s"] * 1e3,
                   steady_steps=r["steady_steps"], device_step_ms=dev * 1e3,
                   host_overhead=max(0.0, 1 - dev / r["steady_step_s"]),
                   pct_roofline=100 * tps / (roof * b) if b == 1 else None,
                   weight_TBps=tps / b * weight_bytes / 1e12, plain_xla_tok_s=peer,
                   with_prefill_tok_s=r["decode_tok_s"], with_prefill_step_ms_median=r["step_s_median"] * 1e3)
        rows.append(row)
        print(f"batch {b:3d}: decode {tps:8.1f} tok/s ({tps / b:6.1f}/user, {row['weight_TBps']:.2f} TB/s of "
              f"weights; {r['steady_steps']} steps with all {b} decoding) | TTFT {r['ttft_s'] * 1e3:7.1f} ms | step "
              f"{r['steady_step_s'] * 1e3:.2f} ms, device-only {dev * 1e3:.2f} ms -> host overhead "
              f"{100 * row['host_overhead']:.1f}% | plain XLA {peer or float('nan'):.1f} tok/s | all steps after "
              f"the first token (prefill of others included): {r['decode_tok_s']:.1f} tok/s")
    path = write_result("latency", dict(model=a.model, attention_backend=a.attention_backend, prompt_len=a.prompt_len, new_tokens=a.new_tokens,
                                        hbm_TBps=bw / 1e12, weight_GB=weight_bytes / 1e9, startup_s=startup,
                                        rows=rows))
    print("wrote", path)


def plain_decode(llm, batch):
    from benchmarks.peers.plain_xla import plain_decode_tokens_per_s

    return plain_decode_tokens_per_s(llm.model, batch, context=512)


if __name__ == "__main__":
    main()
