"""Where does the step's time go? Times the pieces of one decode step in isolation on the device:
the whole step, the forward pass without sampling, one layer's attention, the KV write, the sampler, and the
plain matmuls of one layer, each as its own jitted program.

  python benchmarks/step_breakdown.py --model llama3-8b --batch 1 64
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks.common import write_result  # noqa: E402
from jaxinfer import LLM  # noqa: E402
from jaxinfer.models.attention import AttentionMetadata, device_num_sms, kernel_split_options  # noqa: E402
from jaxinfer.outputs import SeqInput  # noqa: E402
from jaxinfer.runner.batch import pack  # noqa: E402
from jaxinfer.runner.sampler import SamplingTensors, sample  # noqa: E402
from pallas_kernels.paged_attention.kernel import ragged_paged_attention  # noqa: E402
from pallas_kernels.paged_attention.reference import ragged_paged_attention_reference, write_kv_pages  # noqa


def timeit(f, *args, iters=20):
    out = f(*args)
    jax.block_until_ready(out)
    t0 = time.perf_counter()
    for _ in range(iters):
        out = f(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - t0) / iters * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--context", type=int, default=256)
    from benchmarks.common import add_engine_flags, add_profile_arg, engine_config, start_profile
    add_engine_flags(ap, model="llama3-8b", load_format="dummy", max_model_len=1024, max_num_batched_tokens=256,
                     gpu_memory_utilization=0.5)  # --max-num-seqs is max(--batch)
    add_profile_arg(ap)
    a = ap.parse_args()
    start_profile(a.profile)
    llm = LLM(config=engine_config(a, max_num_seqs=max(a.batch)))
    r = llm.runner
    cfg = llm.model_config
    loaded = r.loaded
    results = {}
    for b in a.batch:
        npg = a.context // r.page_size + 1
        seqs = [SeqInput(token_ids=[1], start_pos=a.context, page_table=list(range(1 + i * npg, 1 + (i + 1) * npg)))
                for i in range(b)]
        hb = pack(seqs, r.ladder.pick(b, b), r.page_size)
        dev = jax.device_put(hb.arrays)
        rows = {}

        step = r.step_program(hb)  # the program the engine runs for these rows
        ints, floats = jax.device_put(hb.flat())
        r.run_compiled(step, ints, floats)
        t0 = time.perf_counter()
        for _ in range(20):
            o, _ = r.run_compiled(step, ints, floats)
        jax.block_until_ready(o)
        rows["whole step"] = (time.perf_counter() - t0) / 20 * 1e3
        kv = r.kv_caches

        md = AttentionMetadata(dev["positions"], dev["slot_mapping"], dev["tile_tokens"], dev["tile_seq"],
                               dev["tile_kv_len"], dev["page_tables"])
        from jaxinfer.models.attention import AttentionOptions

        aopts = AttentionOptions(min(32, a.max_model_len // r.page_size), True)

        def forward_only(params, kv, d):
            m = loaded.module(params)
            hidden, kv = m(d["input_ids"], kv, md, aopts)
            return kv, jnp.argmax(m.logits(hidden[d["sample_idx"]]), -1)

        fwd = jax.jit(forward_only, donate_argnums=(1,))
        kv, o = fwd(loaded.params, kv, dev)
        t0 = time.perf_counter()
        for _ in range(20):
            kv, o = fwd(loaded.params, kv, dev)
        jax.block_until_ready(o)
        rows["forward+argmax (no sampler)"] = (time.perf_counter() - t0) / 20 * 1e3
        r.kv_caches = kv

        T = hb.bucket.num_tokens
        q = jax.random.normal(jax.random.key(0), (T, cfg.num_heads, cfg.head_dim), loaded.dtype)
        knew = jax.random.normal(jax.random.key(1), (T, cfg.num_kv_heads, cfg.head_dim), loaded.dtype)
        kp, vp = kv[0]
        attn = jax.jit(lambda q, kp, vp: ragged_paged_attention_reference(
            q, kp, vp, md.positions, md.tile_tokens, md.tile_seq, md.tile_kv_len, md.page_tables,
            sm_scale=0.088, kv_chunk_pages=aopts.kv_chunk_pages, static_loop=True))
        rows["attention reference, one layer (x32)"] = timeit(attn, q, kp, vp) * 32
        if jax.default_backend() == "gpu":
            splits = kernel_split_options(hb.bucket.num_seqs, cfg.num_kv_heads, device_num_sms())  # the engine's choice
            kern = jax.jit(lambda q, kp, vp: ragged_paged_attention(
                q, kp, vp, md.positions, md.tile_tokens, md.tile_seq, md.tile_kv_len, md.page_tables,
                sm_scale=0.088, pages_per_block=max(1, 64 // r.page_size), **splits))
            rows["attention pallas kernel, one layer (x32)"] = timeit(kern, q, kp, vp) * 32
        # KV write as in the step: all layers' caches donated in one program (in-place scatter per layer).
        def write_all(kv, k):
            return [write_kv_pages(kp_, vp_, k, k, md.slot_mapping) for kp_, vp_ in kv]

        write = jax.jit(write_all, donate_argnums=(0,))
        kv = write(kv, knew)
        jax.block_until_ready(kv)
        t0 = time.perf_counter()
        for _ in range(20):
            kv = write(kv, knew)
        jax.block_until_ready(kv)
        rows["kv write, all layers (in-place XLA scatter)"] = (time.perf_counter() - t0) / 20 * 1e3
        r.kv_caches = kv
        S = hb.bucket.num_seqs
        logits = jax.random.normal(jax.random.key(2), (S, cfg.vocab_size), jnp.float32)
        z = jnp.zeros((S,), jnp.float32)
        for name, temp in (("sampler greedy", 0.0), ("sampler T=1 top_p=0.9", 1.0)):
            st = SamplingTensors(temperature=z + temp, top_k=jnp.full((S,), -1, jnp.int32), top_p=z + 0.9,
                                 min_p=z, seed=jnp.zeros((S,), jnp.uint32), step=jnp.zeros((S,), jnp.int32),
                                 presence_penalty=z, frequency_penalty=z, repetition_penalty=z + 1)
            rows[name] = timeit(jax.jit(sample), logits, st)
        rows["lax.top_k(256) alone"] = timeit(jax.jit(lambda x: jax.lax.top_k(x, 256)), logits)
        rows["lax.top_k(20) alone"] = timeit(jax.jit(lambda x: jax.lax.top_k(x, 20)), logits)
        x = jax.random.normal(jax.random.key(3), (T, cfg.hidden_size), loaded.dtype)
        m = loaded.module()
        lay = m.layers[0]
        mats = jax.jit(lambda x, a, b, c, d: ((x @ a)[:, :cfg.hidden_size] @ b + (
            (x @ c)[:, :cfg.intermediate_size] @ d)))
        rows["4 matmuls of one layer (x32)"] = timeit(
            mats, x, lay.attn.qkv.w[...], lay.attn.o.w[...], lay.mlp.gate_up.w[...], lay.mlp.down.w[...]) * 32
        head = jax.jit(lambda h: m.logits(h))
        rows["final norm + lm_head"] = timeit(head, x[:S])
        if b == a.batch[0]:  # prefill: one sequence, a 256-token chunk after 256 cached tokens (TTFT's unit)
            pre = [SeqInput(token_ids=[1] * 256, start_pos=256, page_table=list(range(1, 34)))]
            hp = pack(pre, r.ladder.pick(256, 1), r.page_size)
            pstep = r.step_program(hp)
            pi, pf = jax.device_put(hp.flat())
            r.kv_caches = kv
            o, _ = r.run_compiled(pstep, pi, pf)
            jax.block_until_ready(o)
            t0 = time.perf_counter()
            for _ in range(10):
                o, _ = r.run_compiled(pstep, pi, pf)
            jax.block_until_ready(o)
            rows["prefill step, 256 tokens after 256 (whole step)"] = (time.perf_counter() - t0) / 10 * 1e3
        print(f"--- batch {b} (bucket T={T}, S={S}, tiles={hb.bucket.num_tiles}, width={hb.bucket.table_width})")
        for k, v in rows.items():
            print(f"  {k:45s} {v:8.3f} ms")
        results[b] = rows
        write_result("step-breakdown", dict(model=a.model, attention_backend=a.attention_backend, context=a.context,
                                            max_model_len=a.max_model_len, ms_by_batch=results))


if __name__ == "__main__":
    main()
