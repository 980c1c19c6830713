"""Where does the device time of one engine step go? Whole-step times of the engine's own compiled programs for a
few step shapes, each beside its FLOP / byte roofline and a same-process peer (the step's plain matmuls), and a
per-kernel table of the device time from a jax.profiler trace of the same steps (issue 17 items 3 and 4).

Step shapes (Llama-3-8B dummy weights, bf16; every token of a prefill chunk is new, context = cached tokens):
  decode-b1       1 sequence, 1 token, context 512            (batch-1 latency: the plain-XLA gap)
  decode-b64      64 sequences x 1 token, context 704          (the <= 7.2 ms device-only target)
  decode-b256     256 sequences x 1 token, context 512         (offline decode; int4's many-token kernel)
  prefill-256     1 sequence, 256 tokens after 256 cached      (TTFT's unit; issue: 9.88 ms, ~53% matmul rate)
  prefill-2048    8 sequences x 256 tokens after 256 cached    (a large chunked-prefill step: >= 60% target)
  mixed-2048      509 decodes at context 640 + 3 whole 512-token prompts (2,045 tokens: the offline run's usual
                  step at --max-num-seqs 512 --max-num-batched-tokens 2048; its decodes' attention goes through
                  the Pallas kernel, not cuDNN; needs --max-num-seqs 512)
  decode-b512     512 sequences x 1 token, context 640         (the same run's pure-decode steps: cuDNN's bucket)
  mixed-370       370 decodes at context 640 + 3 prompts of 559 (2,047 tokens: the mean mixed step of that run on an
                  H200's KV pool, benchmarks/probes/offline_step_mix.py)
  mixed-64        64 decodes at context 640 + 4 prompts of 496 (a prefill-heavy step)
For each: the mean of --iters back-to-back calls (device time: the host call returns at once since the dispatch
fix) beside the median of --iters single calls each waited for (call + wait), the FLOPs of the step (2 x non-embedding params x tokens + causal attention + LM head on the
sampled rows) over the bf16 matmul rate measured first (an 8192^3 XLA dot), the weight bytes over the measured HBM
bandwidth, and the peer: the same M through the 4 matmuls of one layer as plain XLA dots, x layers (no LM head).

Profile table: per step shape, the device kernels' time per step grouped by XLA op name (the trace's "XLA Ops"
line of the GPU plane), top --top. Read it as: what is neither a weight matmul nor attention is the overhead.

  python benchmarks/probes/step_profile.py [--shapes decode-b1 prefill-256 ...] [--iters 20] [--no-trace]
"""
from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.common import (add_engine_flags, engine_config,  # noqa: E402
                               measure_hbm_bandwidth, measure_matmul_rate, write_result)
from jaxinfer import LLM  # noqa: E402
from jaxinfer.outputs import SeqInput  # noqa: E402
from jaxinfer.runner.batch import pack  # noqa: E402

# name -> groups of (sequences, new tokens per sequence, cached context per sequence)
SHAPES = {"decode-b1": [(1, 1, 512)], "decode-b64": [(64, 1, 704)], "prefill-256": [(1, 256, 256)],
          "prefill-2048": [(8, 256, 256)], "decode-b256": [(256, 1, 512)],
          "mixed-2048": [(509, 1, 640), (3, 512, 0)], "decode-b512": [(512, 1, 640)],
          "mixed-370": [(370, 1, 640), (3, 559, 0)], "mixed-64": [(64, 1, 640), (4, 496, 0)]}
DEFAULT_SHAPES = ["decode-b1", "decode-b64", "prefill-256", "prefill-2048", "decode-b256"]  # (fit 256 sequences)


def device_op_times(trace_dir: str, steps: int) -> tuple[dict[str, float], list[str]]:
    """(µs per step by op / kernel name, the GPU lines seen) from the trace in trace_dir. Uses the GPU planes'
    "XLA Ops" lines when the trace has them, else the per-stream kernel lines (names containing "Stream")."""
    files = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    if not files:
        return {}, []
    prof = jax.profiler.ProfileData.from_file(max(files, key=os.path.getmtime))
    lines = [(plane.name, line) for plane in prof.planes if "GPU" in plane.name or "gpu" in plane.name
             for line in plane.lines]
    seen = sorted({f"{p}:{ln.name}" for p, ln in lines})
    chosen = [ln for _, ln in lines if ln.name == "XLA Ops"] or [ln for _, ln in lines if "Stream" in ln.name]
    tot = collections.Counter()
    for line in chosen:
        for ev in line.events:
            tot[ev.name] += ev.duration_ns / 1e3 / steps
    return dict(tot), seen


def op_kinds(ops: dict[str, float]) -> dict[str, tuple[float, int]]:
    """{op kind: (µs a step, ops a step)}, largest first; the kind is the op name with its digits dropped, so
    the 16 or 32 layers' copies of one fusion (fusion.12, fusion.57, ...) add up to one row."""
    kinds: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
    for name, us in ops.items():
        k = kinds[re.sub(r"[0-9]+", "#", name)]
        k[0] += us
        k[1] += 1
    return {k: (round(v[0], 1), v[1]) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1][0])}


def op_family(name: str) -> str:
    """Coarse family of an XLA op name, for the summary line."""
    n = name.lower()
    for key, fam in (("triton", "pallas/triton kernels"), ("gemm", "matmul (cublas/triton gemm)"),
                     ("dot", "matmul (cublas/triton gemm)"), ("cublas", "matmul (cublas/triton gemm)"),
                     ("scatter", "scatter"), ("gather", "gather"), ("sort", "sort/top-k"),
                     ("reduce", "reduce"), ("fusion", "other fusions"), ("copy", "copy")):
        if key in n:
            return fam
    return "other"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES, choices=list(SHAPES))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--no-trace", action="store_true")
    ap.add_argument("--tag", default="", help="label of this run in the result file's name")
    add_engine_flags(ap, model="llama3-8b", load_format="dummy", max_model_len=2048, max_num_batched_tokens=2048,
                     max_num_seqs=256, gpu_memory_utilization=0.85)
    a = ap.parse_args()
    gpu = jax.default_backend() == "gpu"
    rate = measure_matmul_rate()
    hbm = measure_hbm_bandwidth()
    llm = LLM(config=engine_config(a), warmup=False)   # each shape compiles its own bucket on first use
    r, cfg = llm.runner, llm.model_config
    m = r.loaded.module()
    lay = m.layers[0]
    def float_weight(lin):  # the peer's bf16 [in, out] weight (a quantized layer: zeros of its float shape)
        if hasattr(lin, "w"):
            return lin.w[...]
        q, N = lin.q[...], lin.scale[...].shape[-1]          # every layout's scale ends in the output dim N
        return jnp.zeros((q.size * (2 if q.dtype == jnp.uint8 else 1) // N, N), jnp.bfloat16)
    ws = [float_weight(x) for x in (lay.attn.qkv, lay.attn.o, lay.mlp.gate_up, lay.mlp.down)]
    layer_params = sum(int(np.prod(w.shape)) for w in ws)
    head_params = cfg.vocab_size * cfg.hidden_size
    weight_bytes = llm.model.num_bytes - cfg.vocab_size * cfg.hidden_size * 2   # less the embedding (not read)
    print(f"bf16 matmul rate {rate / 1e12:.0f} TFLOP/s, HBM {hbm / 1e12:.2f} TB/s, weights {weight_bytes / 1e9:.2f} GB")

    def mats(x, a_, b_, c_, d_):  # the layer's 4 dots at this M (slices as in the model: q|k|v, gate|up)
        h = (x @ a_)[:, :cfg.hidden_size] @ b_
        return h + (x @ c_)[:, :cfg.intermediate_size] @ d_
    mats = jax.jit(mats)

    rows = []
    for name in a.shapes:
        groups = SHAPES[name]
        seqs, first = [], 1
        for g_seq, g_new, g_ctx in groups:  # each sequence its own pages, numbered on from the last
            per = (g_ctx + g_new) // r.page_size + 1
            for _ in range(g_seq):
                # page ids past the pool wrap round (the kernels do not bound-check them; the timing only needs
                # each row's pages to be real ones: mixed-2048 asks ~21k pages, an H100's cache holds ~17k)
                pages = [(p - 1) % (r.num_pages - 1) + 1 for p in range(first, first + per)]
                seqs.append(SeqInput(token_ids=[1] * g_new, start_pos=g_ctx, page_table=pages))
                first += per
        n_seq = len(seqs)
        tokens = sum(g_seq * g_new for g_seq, g_new, _ in groups)
        hb = pack(seqs, r.ladder.pick(tokens, n_seq), r.page_size)
        step = r.step_program(hb)
        ints, floats = jax.device_put(hb.flat())
        o, _ = r.run_compiled(step, ints, floats)
        jax.block_until_ready(o)
        times = []
        for _ in range(a.iters):
            t0 = time.perf_counter()
            o, _ = r.run_compiled(step, ints, floats)
            jax.block_until_ready(o)
            times.append(time.perf_counter() - t0)
        step_ms = float(np.median(times)) * 1e3  # one call + wait: includes the host's launch of the program
        t0 = time.perf_counter()
        for _ in range(a.iters):  # back to back: the device time (the next call is launched while one runs)
            o, _ = r.run_compiled(step, ints, floats)
        jax.block_until_ready(o)
        device_ms = (time.perf_counter() - t0) / a.iters * 1e3
        M = hb.bucket.num_tokens
        x = jax.random.normal(jax.random.key(3), (M, cfg.hidden_size), jnp.bfloat16)
        mats(x, *ws).block_until_ready()
        t0 = time.perf_counter()
        for _ in range(a.iters):
            y = mats(x, *ws)
        y.block_until_ready()
        peer_ms = (time.perf_counter() - t0) / a.iters * 1e3 * cfg.num_layers
        attn_flops = sum(4 * cfg.num_heads * cfg.head_dim * g_seq * (g_new * g_ctx + g_new * (g_new + 1) / 2)
                         for g_seq, g_new, g_ctx in groups) * cfg.num_layers
        flops = 2 * layer_params * cfg.num_layers * tokens + attn_flops + 2 * head_params * n_seq
        kv_bytes = sum(g_seq * (g_ctx + g_new) for g_seq, g_new, g_ctx in groups) * cfg.num_kv_heads * cfg.head_dim \
            * 2 * 2 * cfg.num_layers
        floor_ms = max(flops / rate, (weight_bytes + kv_bytes) / hbm) * 1e3
        row = dict(shape=name, bucket=str(hb.bucket), tokens=tokens, step_ms=device_ms, sync_call_ms=step_ms,
                   pct_matmul_rate=100 * flops / rate / (device_ms / 1e3),
                   pct_hbm=100 * (weight_bytes + kv_bytes) / hbm / (device_ms / 1e3),
                   floor_ms=floor_ms, x_floor=device_ms / floor_ms, peer_matmuls_ms_at_bucket_M=peer_ms)
        if gpu and not a.no_trace:
            d = tempfile.mkdtemp(prefix=f"trace-{name}-")
            jax.profiler.start_trace(d)
            for _ in range(5):
                o, _ = r.run_compiled(step, ints, floats)
            jax.block_until_ready(o)
            jax.profiler.stop_trace()
            ops, seen = device_op_times(d, 5)
            row["trace_lines"] = seen[:40]
            fam = collections.Counter()
            for k, v in ops.items():
                fam[op_family(k)] += v
            row["device_us_per_step"] = sum(ops.values())
            row["families_us"] = dict(fam.most_common())
            row["top_ops_us"] = dict(collections.Counter(ops).most_common(a.top))
            row["op_kinds"] = op_kinds(ops)
        rows.append(row)
        print(f"--- {name}: bucket {hb.bucket}")
        print(f"  step {device_ms:.3f} ms back to back ({step_ms:.3f} ms call+wait) = "
              f"{row['pct_matmul_rate']:.0f}% of the matmul rate, {row['pct_hbm']:.0f}% of HBM;"
              f" floor {floor_ms:.3f} ms (x{row['x_floor']:.2f}); peer: the layer dots at M={M} x{cfg.num_layers}"
              f" = {peer_ms:.3f} ms")
        if "top_ops_us" in row:
            if not ops:
                print(f"  no kernel events found; GPU lines in the trace: {seen[:20]}")
            print(f"  traced device time {row['device_us_per_step']:.0f} µs/step; by family: "
                  + ", ".join(f"{k} {v:.0f}" for k, v in row["families_us"].items()))
            for k, v in row["top_ops_us"].items():
                print(f"    {v:9.1f} µs  {k[:110]}")
            print("  by kind (the op name without its numbers: one kind a layer repeats): µs a step, ops a step")
            for k, (us, n) in row["op_kinds"].items():
                print(f"    {us:9.1f} µs  {n:4d}  {k[:100]}")
    write_result("step-profile", tag=a.tag, payload=dict(model=a.model, matmul_tflops=rate / 1e12,
                                                         hbm_tbps=hbm / 1e12, weight_gb=weight_bytes / 1e9, rows=rows))


if __name__ == "__main__":
    main()
