"""A draft model's LM head over the first N token ids only (SpeculativeConfig.draft_head_vocab).

Why: the 1B draft's int8 head streams 128,256 x 2,048 bytes a draft step, 101 of its 1,083 us on an H100
(results/step-profile-draft1b-t1-int8-65dcd08-2026-12-06.json), and issue 21's 1B-draft target needs ~70 us less a
step. FR-Spec (frequency-ranked speculative sampling) restricts the draft's head to the most frequent tokens; here
the tokenizer's id order stands in for the frequency ranking (BPE vocabularies number their merges in the order
they were learned, most frequent first), so the kept rows are a prefix and a kept logit's index is its token id.

Drafts then never propose an id >= N; the target verifies every draft, so outputs stay exactly the target's
(greedy and sampled: the draft's distribution is zero there, which speculative sampling allows). What it costs is
acceptance on text that needs rarer tokens. Measured on the CPU (benchmarks/probes/head_cut_acceptance.py:
SmolLM2-135M drafting for itself, 8 chat answers, 464 greedy tokens, k = 4): a head over 32,768 of its 49,152 ids
accepted 0.963 of the drafts (98.1% of the output's ids are below the cut), over 16,384 ids 0.819 (92.9%); the whole
head 1.000. A rejection also drops the cycle's later drafts, so acceptance falls faster than coverage.
For Llama 3's vocabulary the id order is a poorer stand-in: its first 32,768 ids cover 94.2% of model-written English
answers and 92.3-92.6% of this repository's docs and code (benchmarks/probes/head_cut_coverage.py), so on real text
a 32k cut is estimated to cost more acceptance than it saves time (benchmarks/README.md "2026-12-06 j"); off by
default.

  prune_head(loaded, n)   a LoadedModel whose head has n output columns (a copy of the kept rows: the embedding
                          of a tied model stays whole for the inputs); its `logits` pad the rest with -inf
                          (models/llama.py), so the sampler and the draft programs keep their [.., V] shapes.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxinfer.config import ConfigError
from jaxinfer.models.layers import Linear
from jaxinfer.models.quant_linear import QuantLinear
from jaxinfer.weights.loader import LoadedModel


def prune_head(loaded: LoadedModel, n: int) -> LoadedModel:
    """`loaded` with its LM head cut to the first n token ids (n a multiple of 128 below vocab_size, whole tiles of
    the matmul kernels; n = vocab_size: unchanged)."""
    V = loaded.cfg.vocab_size
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= V or (n < V and n % 128):
        raise ConfigError(f"draft_head_vocab={n!r} must be a multiple of 128 below the draft's vocabulary size {V} "
                          f"(e.g. {min(V // 4 // 128 * 128 or 128, V)}), or {V} for the whole vocabulary")
    if loaded.plan is not None:
        raise ConfigError("draft_head_vocab is for single-device drafts (the draft's head is not sharded)")
    if n == V:
        return loaded
    module = loaded.module()  # merged from the same arrays: only the head's kept rows are copied
    head = module.lm_head
    if head is None:  # tied float head: logits = h @ embed.T -> a Linear over the first n rows of the embedding
        embed = module.embed[...]
        head = Linear(loaded.cfg.hidden_size, n, bias=False, dtype=embed.dtype, axes=("embed", "vocab"))
        head.w.set_value(jnp.asarray(embed[:n].T))
    elif isinstance(head, Linear):
        head.w.set_value(jnp.asarray(head.w[...][:, :n]))
    elif isinstance(head, QuantLinear):
        for name in ("q", "scale", "offset", "b"):  # every leaf carries the "vocab" axis on its output dimension
            leaf = getattr(head, name)
            if leaf is not None:
                axis = tuple(leaf.get_metadata().get("logical_axes") or ()).index("vocab")
                leaf.set_value(jax.lax.slice_in_dim(leaf[...], 0, n, axis=axis))
    else:
        raise ConfigError(f"draft_head_vocab: the draft's head is a {type(head).__name__}, which it cannot cut")
    module.lm_head = nnx.data(head)  # (a tied model's `lm_head = None` is a static attribute until it holds one)
    graphdef, state = nnx.split(module)
    leaves, treedef = jax.tree.flatten(state)
    return LoadedModel(loaded.cfg, loaded.source, graphdef, leaves, treedef, loaded.dtype, loaded.quantization)
