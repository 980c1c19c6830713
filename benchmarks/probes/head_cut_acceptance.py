"""What a draft head cut to the first N token ids costs in acceptance on real text (CPU is fine).

The default model (SmolLM2-135M-Instruct, real weights, vocabulary 49,152) drafts for itself: with its whole head every
greedy draft is accepted, so with the head cut (SpeculativeConfig.draft_head_vocab, weights/head_cut.py) the
acceptance rate is exactly what the cut loses: a draft is rejected where the target's next token has an id >= N
(and the cycle's later drafts with it). Eight chat prompts, 64 greedy tokens each, k = 4; beside it the coverage,
the share of the generated tokens with ids < N. The GPU benchmark (spec_speed.py with forced acceptance) cannot see
this loss, only the time the cut saves.

  PYTHONPATH=$PWD python benchmarks/probes/head_cut_acceptance.py [--vocab 32768 16384]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.common import write_result  # noqa: E402
from jaxinfer import LLM, SamplingParams  # noqa: E402
from jaxinfer.weights.default_model import default_model_path  # noqa: E402

PROMPTS = ["Explain how a bicycle works.", "Write a short poem about the sea.",
           "What is the capital of France and why is it famous?", "Give three tips for learning to program.",
           "Describe photosynthesis in simple terms.", "Summarize the plot of Romeo and Juliet.",
           "How do vaccines work?", "Write a Python function that reverses a string."]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, nargs="+", default=[32768, 16384])
    ap.add_argument("--max-tokens", type=int, default=64)
    a = ap.parse_args()
    path = default_model_path()
    rows = []
    for n in [None] + a.vocab:
        sc = dict(method="draft", draft_model=path, num_speculative_tokens=4, batch_policy=False, draft_head_vocab=n)
        llm = LLM(path, speculative_config=sc, progress=False, max_num_seqs=len(PROMPTS))
        t = time.perf_counter()
        outs = llm.chat([[{"role": "user", "content": q}] for q in PROMPTS],
                        SamplingParams(max_tokens=a.max_tokens, temperature=0.0), use_tqdm=False)
        ids = [i for o in outs for i in o.outputs[0].token_ids]
        st = llm.engine.spec_stats()
        row = dict(draft_head_vocab=n, acceptance_rate=st["acceptance_rate"], tokens=len(ids),
                   coverage=sum(i < (n or llm.model.cfg.vocab_size) for i in ids) / len(ids),
                   wall_s=time.perf_counter() - t)
        rows.append(row)
        print(f"head over {n or llm.model.cfg.vocab_size:>6} ids: acceptance {row['acceptance_rate']:.3f}, "
              f"coverage of the output {row['coverage']:.3f} ({len(ids)} tokens)", flush=True)
    print("wrote", write_result("head-cut-acceptance", {"model": path, "k": 4, "prompts": PROMPTS, "rows": rows}))


if __name__ == "__main__":
    main()
