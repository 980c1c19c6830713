"""Offline throughput: N requests submitted at once, run to completion by the continuous-batching engine.

Workloads (fixed seed, random token ids, ignore_eos so every request produces exactly its output length):
  fixed     : --num-requests prompts of --prompt-len tokens, --output-len new tokens each (default 1000 x 512/256)
  sharegpt  : a ShareGPT-like mix, log-normal lengths (mean ~220 in / ~200 out), clipped to
              [4, min(1024, max_model_len / 2)]

  python benchmarks/throughput.py --model llama3-8b --load-format dummy [--workload fixed sharegpt]
         [--hf-baseline]   # transformers eager generate on the same shapes, in a subprocess of this call
  python benchmarks/throughput.py --model tiny-llama --num-requests 16 --prompt-len 32 --output-len 16 \\
         --max-model-len 256 --max-num-seqs 8 --max-num-batched-tokens 128              # CPU smoke test

Ceiling beside each figure (same process): the compute bound, i.e. every prompt and output token costing
2 x parameters FLOPs (embedding included, attention excluded: issue 17's convention, 16.06 GFLOP at the 8B shape)
at the bf16 matmul rate measured in this process (benchmarks.common.measure_matmul_flops, ~789 TFLOP/s on the
H200); output tok/s bound = output tokens / (all tokens x FLOPs per token / FLOP/s). Issue 17's targets are
printed beside: fixed >= 10,000 output tok/s, ShareGPT-like >= 45 req/s.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402


def make_workload(kind: str, n: int, prompt_len: int, output_len: int, vocab: int, max_len: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    if kind == "fixed":
        lens = [(prompt_len, output_len)] * n
    elif kind == "sharegpt":
        # log-normal with sigma 0.9: mean = exp(mu + sigma^2 / 2)
        sig = 0.9
        pin = rng.lognormal(np.log(220) - sig**2 / 2, sig, n)
        pout = rng.lognormal(np.log(200) - sig**2 / 2, sig, n)
        cap = min(1024, max_len // 2)
        lens = [(int(np.clip(a, 4, cap)), int(np.clip(b, 4, cap))) for a, b in zip(pin, pout)]
    else:
        raise ValueError(f"unknown workload {kind!r}")
    return [(rng.integers(0, vocab, a).tolist(), b) for a, b in lens]


def run_engine(llm, work, profile_dir=None):
    from jaxinfer import SamplingParams
    from benchmarks.common import maybe_profile

    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for _, m in work]
    t0 = time.perf_counter()
    with maybe_profile(profile_dir):
        outs = llm.generate([p for p, _ in work], params, use_tqdm=False)
    dt = time.perf_counter() - t0
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    n_in = sum(len(p) for p, _ in work)
    assert n_out == sum(m for _, m in work), "every request must produce exactly max_tokens tokens"
    return dict(requests=len(work), seconds=dt, req_per_s=len(work) / dt, output_tok_per_s=n_out / dt,
                total_tok_per_s=(n_in + n_out) / dt, prompt_tokens=n_in, output_tokens=n_out)


HF_SCRIPT = r"""
import json, sys, time, torch, transformers as tf
cfg = json.loads(sys.argv[1]); batch, plen, olen = map(int, sys.argv[2:5])
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    model = tf.LlamaForCausalLM(tf.LlamaConfig(**cfg)).eval()
ids = torch.randint(0, cfg["vocab_size"], (batch, plen), device="cuda")
gen = dict(do_sample=False, max_new_tokens=olen, min_new_tokens=olen, pad_token_id=0,
           attention_mask=torch.ones_like(ids))
warm = dict(max_new_tokens=4, min_new_tokens=4, attention_mask=torch.ones_like(ids[:, :16]))
model.generate(ids[:, :16], **{**gen, **warm})
torch.cuda.synchronize(); t0 = time.perf_counter()
with torch.no_grad():
    out = model.generate(ids, **gen)
torch.cuda.synchronize(); dt = time.perf_counter() - t0
print(json.dumps(dict(batch=batch, prompt_len=plen, output_len=olen, seconds=dt,
                      output_tok_per_s=batch * olen / dt, transformers=tf.__version__, torch=torch.__version__)))
"""


def hf_baseline(hf_cfg: dict, batch: int, prompt_len: int, output_len: int) -> dict | None:
    """transformers eager generate at one batch of the fixed workload's shapes (subprocess, before JAX)."""
    cfg = {k: v for k, v in hf_cfg.items() if k not in ("architectures", "model_type", "torch_dtype")}
    try:
        out = subprocess.run([sys.executable, "-c", HF_SCRIPT, json.dumps(cfg), str(batch), str(prompt_len),
                              str(output_len)], capture_output=True, text=True, timeout=400)
        line = [l for l in out.stdout.splitlines() if l.startswith("{")]
        if not line:
            print("transformers baseline failed:", out.stderr[-2000:])
            return None
        return json.loads(line[-1])
    except Exception as e:  # report, never hide
        print("transformers baseline failed:", e)
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", nargs="+", default=["fixed", "sharegpt"])
    ap.add_argument("--num-requests", type=int, default=1000)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--hf-baseline", action="store_true")
    ap.add_argument("--hf-batch", type=int, default=64)
    ap.add_argument("--profile", default=None)
    ap.add_argument("--tag", default="", help="appended to the result file's name (one side of an A/B)")
    from benchmarks.common import add_engine_flags, engine_config
    add_engine_flags(ap, model="llama3-8b", load_format="dummy", max_model_len=2048)
    a = ap.parse_args()

    from jaxinfer.weights.presets import PRESETS

    hf = None
    if a.hf_baseline and a.model in PRESETS:
        hf = hf_baseline(PRESETS[a.model], a.hf_batch, a.prompt_len, a.output_len)
        print("transformers eager generate:", hf)

    import jax
    from benchmarks.common import compilation_cache_entries, measure_hbm_bandwidth, measure_matmul_flops, write_result
    from jaxinfer import LLM

    bw = measure_hbm_bandwidth()
    flops = measure_matmul_flops()
    cache_before = compilation_cache_entries()
    t0 = time.perf_counter()
    llm = LLM(config=engine_config(a))
    startup = time.perf_counter() - t0
    cache_after = compilation_cache_entries()  # > cache_before: LLM() compiled programs the cache did not hold
    background_s = llm.runner.finish_background_compiles()  # the timed runs: no compile beside their steps
    weight_bytes = llm.model.num_bytes
    flop_per_token = 2 * sum(int(p.size) for p in llm.model.params)
    print(f"device {jax.devices()[0].device_kind}; HBM {bw / 1e12:.2f} TB/s; bf16 matmul {flops / 1e12:.0f} TFLOP/s; "
          f"{flop_per_token / 1e9:.2f} GFLOP/token; LLM() {startup:.1f} s (compilation-cache entries {cache_before} "
          f"-> {cache_after}); KV pages {llm.runner.num_pages}; then {background_s:.1f} s for background compiles",
          flush=True)
    results = {}
    for kind in a.workload:
        work = make_workload(kind, a.num_requests, a.prompt_len, a.output_len, llm.model_config.vocab_size,
                             llm.max_model_len)
        r = run_engine(llm, work, a.profile if kind == a.workload[0] else None)
        # Roofline for decode: every step streams all weights once; with B sequences per step the best case is
        # B tokens per weight pass. Report the achieved weight-stream rate at the mean batch as a sanity figure.
        bound_s = (r["prompt_tokens"] + r["output_tokens"]) * flop_per_token / flops
        r["compute_bound_output_tok_per_s"] = r["output_tokens"] / bound_s
        r["pct_compute_bound"] = 100 * r["output_tok_per_s"] / r["compute_bound_output_tok_per_s"]
        results[kind] = r
        peer = f" | transformers eager {hf['output_tok_per_s']:.0f} tok/s (batch {hf['batch']})" if (
            hf and kind == "fixed") else ""
        target = {"fixed": "target >= 10,000 output tok/s", "sharegpt": "target >= 45 req/s"}.get(kind, "")
        print(f"{kind:9s}: {r['requests']} req in {r['seconds']:.1f} s = {r['req_per_s']:.2f} req/s, "
              f"{r['output_tok_per_s']:.0f} output tok/s, {r['total_tok_per_s']:.0f} total tok/s | compute bound "
              f"{r['compute_bound_output_tok_per_s']:.0f} output tok/s -> {r['pct_compute_bound']:.0f}% | "
              f"{target}{peer}", flush=True)
        # written after every workload, so a run cut short still leaves its finished figures
        path = write_result("throughput", dict(
            model=a.model, startup_s=startup, background_compile_s=background_s, hbm_TBps=bw / 1e12,
            matmul_TFLOPs=flops / 1e12, flop_per_token=flop_per_token, compilation_cache_entries_before=cache_before,
            compilation_cache_entries_after=cache_after, num_pages=llm.runner.num_pages,
            weight_GB=weight_bytes / 1e9, config=vars(a), results=results, transformers_baseline=hf), tag=a.tag)
        print("wrote", path)


if __name__ == "__main__":
    main()
