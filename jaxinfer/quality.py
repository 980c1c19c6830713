"""Quality measurement: perplexity of a model (as served by the engine) on a fixed text shipped with the package.

The text (`jaxinfer/data/quality_text.txt`, ~1,900 words / ~2,200 SmolLM2 tokens) is an original essay written
for this purpose, so every quantization setting is measured on the same tokens and nothing is downloaded.

Perplexity goes through the engine's own prompt-logprob path (the same paged attention, KV cache dtype and
weights a request uses), so it measures exactly what serving would compute: exp(mean negative log-likelihood)
of tokens 1..n-1 given their prefixes.
"""
from __future__ import annotations

import math
import os

import numpy as np

QUALITY_TEXT_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "quality_text.txt")


def quality_text() -> str:
    with open(QUALITY_TEXT_PATH, encoding="utf-8") as f:
        return f.read()


def token_nll(llm, token_ids) -> np.ndarray:
    """float64 [n - 1]: -log p(token_i | tokens_<i) for i = 1..n-1, from the engine's prompt log-probs."""
    from jaxinfer.sampling_params import SamplingParams

    ids = [int(t) for t in token_ids]
    if len(ids) < 2:
        raise ValueError(f"perplexity needs at least 2 tokens, got {len(ids)}")
    if len(ids) + 1 > llm.runner.max_model_len:
        raise ValueError(f"the text has {len(ids)} tokens but max_model_len is {llm.runner.max_model_len}; "
                         f"create the LLM with max_model_len >= {len(ids) + 1} or pass fewer tokens")
    out = llm.generate([ids], SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
    lps = out.prompt_logprobs
    return np.array([-lps[i][ids[i]].logprob for i in range(1, len(ids))], np.float64)


def perplexity(llm, text_or_ids=None, *, num_tokens: int | None = None) -> float:
    """Perplexity of `llm` on a text (str, tokenized by the LLM's tokenizer) or token ids; default: the shipped
    quality text. num_tokens: use only the first num_tokens tokens."""
    if text_or_ids is None:
        text_or_ids = quality_text()
    if isinstance(text_or_ids, str):
        if llm.tokenizer is None:
            raise ValueError("this model has no tokenizer: pass token ids instead of text")
        ids = llm.tokenizer.encode(text_or_ids)
    else:
        ids = list(text_or_ids)
    if num_tokens is not None:
        ids = ids[:num_tokens]
    return float(math.exp(token_nll(llm, ids).mean()))
