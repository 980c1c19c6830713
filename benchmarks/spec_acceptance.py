"""Real acceptance of speculative decoding on the default model (SmolLM2-135M-Instruct, CPU is fine): n-gram and
layer-skip drafts on prompts that quote their input (summarize, fix code, extract, rewrite) and on free chat.

Greedy decoding, fixed k (adaptive k off, so the rate is the drafts' own quality). Reported per method and
prompt kind: acceptance rate (accepted / drafted tokens), mean accepted length (tokens per verification =
accepted + 1), drafts per verification, and how many outputs equal plain decoding's (all of them in float32; in
bfloat16 a near-tie can flip the argmax when k + 1 positions are computed at once instead of one).

  python benchmarks/spec_acceptance.py [--max-tokens 64] [--k 4]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402

from benchmarks.common import RESULTS_DIR, add_engine_flags, engine_config, git_commit  # noqa: E402
from jaxinfer import LLM, SamplingParams  # noqa: E402

_TEXT = ("The Great Barrier Reef is the world's largest coral reef system, composed of over 2,900 individual reefs "
         "and 900 islands stretching for over 2,300 kilometres. The reef is located in the Coral Sea, off the coast "
         "of Queensland, Australia. It can be seen from outer space and is the world's biggest single structure "
         "made by living organisms. Rising sea temperatures have caused mass coral bleaching events in 2016, 2017 "
         "and 2020, and the reef's future depends on cutting greenhouse gas emissions.")
_CODE = '''def average(values):
    total = 0
    for v in values:
        total += v
    return total / len(values) + 1

def maximum(values):
    best = values[0]
    for v in values:
        if v > best:
            best = v
    return best
'''
_CONTACTS = ("Please reach out to Alice Martin (alice.martin@example.com) for billing, to Bob Chen at "
             "bob.chen@example.org for technical support, and to Carla Diaz, carla@example.net, for press requests.")

QUOTING = [
    f"Summarize this text in two sentences, reusing its wording:\n\n{_TEXT}",
    f"This Python code has a bug in `average`. Return the whole corrected code, unchanged otherwise:\n\n{_CODE}",
    f"Extract every person and email address from this text as a JSON list of objects with keys name and "
    f"email:\n\n{_CONTACTS}",
    f"Repeat the following paragraph exactly, but replace 'reef' with 'REEF':\n\n{_TEXT}",
]
CHAT = [
    "Tell me a short story about a dragon who learns to bake bread.",
    "What are three benefits of regular exercise?",
    "Explain how rainbows form, for a ten-year-old.",
    "Give me some tips for learning a new language.",
]


def run(llm, prompts, max_tokens):
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    t0 = time.perf_counter()
    outs = llm.chat([[{"role": "user", "content": p}] for p in prompts], sp, use_tqdm=False)
    dt = time.perf_counter() - t0
    return outs, dt


def summarize(outs, dt):
    m = [o.metrics for o in outs]
    steps = sum(x.get("spec_verify_steps", 0) for x in m)
    drafts = sum(x.get("spec_draft_tokens", 0) for x in m)
    acc = sum(x.get("spec_accepted_tokens", 0) for x in m)
    toks = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"acceptance_rate": round(acc / drafts, 4) if drafts else None,
            "mean_accepted_length": round((acc + steps) / steps, 3) if steps else None,
            "drafts_per_verification": round(drafts / steps, 3) if steps else None,
            "verify_steps": steps, "draft_tokens": drafts, "accepted_tokens": acc, "output_tokens": toks,
            "wall_s": round(dt, 2)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--methods", nargs="+", default=["ngram", "layer_skip"],
                    choices=["ngram", "ngram_unpipelined", "layer_skip", "self_int8", "self_int8_floathead"],
                    help="ngram: pipelined (device prompt lookup, runner/ngram_device.py); ngram_unpipelined: the "
                         "host proposer, each speculative step finished before the next; self_int8: the model itself "
                         "as its draft, weights int8 (draft_quantization) with the default int8 head; "
                         "self_int8_floathead: the same with a float head (what int8 quantization alone costs "
                         "in agreement)")
    ap.add_argument("--skip-plain", action="store_true", help="no plain-decoding run (outputs_equal_plain: null)")
    ap.add_argument("--layers", type=int, nargs="+", default=None,
                    help="layer_skip draft depths (default: a quarter and half of the target's layers)")
    # --dtype auto = bfloat16 for this GGUF; float32 makes outputs_equal_plain exact (bf16 near-ties can flip
    # between chunk shapes)
    add_engine_flags(ap, max_model_len=1024, max_num_batched_tokens=256, max_num_seqs=8)
    a = ap.parse_args(argv)
    config = engine_config(a)
    base = LLM(config=config, progress=False, warmup=False)
    n_layers = base.model_config.num_layers
    layers = a.layers or [max(1, n_layers // 4), n_layers // 2]
    ref = {} if a.skip_plain else {kind: run(base, prompts, a.max_tokens)
                                   for kind, prompts in (("quoting", QUOTING), ("chat", CHAT))}
    methods = ([("ngram", dict(method="ngram"))] if "ngram" in a.methods else []) + (
        [("ngram_unpipelined", dict(method="ngram", pipelined=False))] if "ngram_unpipelined" in a.methods else []) + [
        (f"layer_skip_{n}of{n_layers}", dict(method="layer_skip", num_draft_layers=n)) for n in layers
        if "layer_skip" in a.methods] + [
        (name, dict(method="draft", draft_model=base.source.path, draft_quantization="int8",
                    draft_quantize_lm_head=False if name.endswith("floathead") else None))
        for name in ("self_int8", "self_int8_floathead") if name in a.methods]
    results = {"plain": {kind: {"wall_s": round(dt, 2)} for kind, (_, dt) in ref.items()}}
    for name, sc in methods:
        llm = LLM(config=config.replace(speculative_config=dict(sc, num_speculative_tokens=a.k, adaptive=False,
                                                                     batch_policy=False)),
                  progress=False, warmup=False)
        results[name] = {}
        for kind, prompts in (("quoting", QUOTING), ("chat", CHAT)):
            outs, dt = run(llm, prompts, a.max_tokens)
            r = summarize(outs, dt)
            r["outputs_equal_plain"] = None if kind not in ref else sum(
                o.outputs[0].token_ids == b.outputs[0].token_ids for o, b in zip(outs, ref[kind][0]))
            r["num_prompts"] = len(prompts)
            results[name][kind] = r
            print(name, kind, json.dumps(r), flush=True)
        del llm
    payload = {"benchmark": "spec-acceptance", "model": base.source.name,
               "dtype": jax.numpy.dtype(base.model.dtype).name,
               "device": jax.devices()[0].platform, "jax": jax.__version__, "commit": git_commit(),
               "date": time.strftime("%Y-%m-%d"), "k": a.k, "max_tokens": a.max_tokens, "greedy": True,
               "adaptive_k": False, "results": results,
               "examples": {kind: [o.outputs[0].text[:200] for o in ref[kind][0]] for kind in ref}}
    # A CPU result on purpose (acceptance does not depend on the device): named without the "-cpu-" marker that
    # .gitignore uses for CPU smoke runs of the GPU benchmarks.
    path = os.path.join(RESULTS_DIR, f"spec-acceptance-smollm2-{'-'.join(a.methods)}-{payload['date']}.json")
    with open(path, "w") as f:
        json.dump(payload, f, indent=2)
    print("wrote", path)


if __name__ == "__main__":
    main()
